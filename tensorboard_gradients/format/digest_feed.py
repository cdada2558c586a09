"""`DigestFeed`: the writer's digest of one stats tag, so TensorBoard opens a long run at once.

Judging a run of 1,000 variables x 100,000 steps takes the plugin tens of seconds after
TensorBoard starts, every time it starts. The writer has every step in hand anyway: it feeds
the steps it writes to the same `analysis.digest.Digest` the plugin would build (in a background
thread, `EVERY_STEPS` at a time: nothing waits on the training thread) and writes what changed
as a digest record (`metadata` kind ``digest``) every `EVERY_STEPS` steps and at close. The
plugin reads those few records instead of every step (`server.store.local_tag`).

A digest describes the steps as this writer wrote them. When it could mislead (a step written
again or out of order, a digest record lost to a full disk, an epoch mark for a step already
digested) the feed writes a ``void`` record that tells readers to ignore the records before it,
and stops: the plugin then reads the statistics themselves, as for runs written without a
digest. The feed never raises into training: a failure is logged once and stops it.
"""

import concurrent.futures
import logging
import os
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import digest
from tensorboard_gradients.format import metadata
from tensorboard_gradients.format.series import loss_curve, series_from_points, with_loss

logger = logging.getLogger(__name__)

# Steps per digest record (and per feed of the digest).
EVERY_STEPS = 1000
# Logged steps per block at first (the plugin's own digest starts at 1). Every time blocks merge
# in pairs the next record writes them all again, so small first blocks cost the most disk for
# the least use: this digest answers only until the plugin's own has read the run, which is
# seconds for runs short enough to show blocks of fewer steps. 16 steps: 2,000 blocks up to
# 32,000 steps, 3 merges by 100,000 steps (2.5 bytes per variable and step in all, measured).
FIRST_BLOCK_STEPS = 16


class DigestFeed:
    """The digest of one stats tag of one writer.

    Args:
      tag: the stats tag; name: its summary name; layout: its `Layout`.
      emit: ``emit({tag suffix: payload}, step) -> bool``: writes a digest record's values
        (`metadata.encode_digest`: under `metadata.DIGEST_TAG_SUFFIX` the record, under
        `metadata.DIGEST_BLOCKS_TAG_SUFFIX` its `analysis.digest.BLOCK_ARRAYS`) as the writer's
        next event at ``step`` (the last step it covers, so each record has a step of its own;
        None: the last step written), True when it was written.
    """

    def __init__(self, tag: str, name: str, layout,
                 emit: Callable[[Dict[str, bytes], Optional[int]], bool]):
        self._parsed = metadata.parse_plugin_data(metadata.stats_metadata_content(name, layout))
        self._tag = tag
        self._emit = emit
        self._rows: List[tuple] = []  # (step, stats matrix, loss) not handed to the digest yet
        self._last_step = None  # the last step added
        self._fed_step = None  # the last step handed to the digest
        self._epochs = ([], [])  # (first steps, indices)
        self._digest = None
        self._written = None  # digest.Written
        self._handed = 0  # rows handed to the worker
        self._records = 0  # records written (by the worker)
        self._stopped = False
        # Tells this digest's records from another writer's in the same run (`chained`).
        self._id = np.frombuffer(os.urandom(8), dtype=np.int64)[0]
        self._jobs_lock = threading.Lock()  # `_jobs` is added to from both threads
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tensorboard-gradients digest")
        self._jobs: List[concurrent.futures.Future] = []

    def add(self, step: int, stats: np.ndarray, loss: Optional[float] = None) -> None:
        """Takes a step just written, as written, with the loss written beside it (None: none;
        call `add`, `epoch` and `hand_over_rest` under the writer's lock)."""
        if self._stopped:
            return
        if self._last_step is not None and step <= self._last_step:
            self._stop(f"step {step} was written after step {self._last_step}")
            return
        self._last_step = step
        # The rows are handed over when the next step comes: a loss reported once its step is
        # done (`loss`) still finds its row.
        if len(self._rows) >= EVERY_STEPS:
            self._hand_over()
        self._rows.append((step, stats, loss))

    def epoch(self, step: int, epoch: int) -> None:
        """Takes an epoch mark (blocks are cut where epochs start)."""
        if self._stopped:
            return
        if self._fed_step is not None and step <= self._fed_step:
            self._stop(f"the mark of epoch {epoch} at step {step} came after that step was "
                       "digested")
            return
        self._epochs[0].append(int(step))
        self._epochs[1].append(int(epoch))

    def loss(self, step: int, loss: float) -> None:
        """Takes a loss written after its step's statistics (a trainer reports it once the step
        is done): the step's row takes it, unless the row was digested already (then the
        digest stops: its records would judge that step without the loss readers see)."""
        if self._stopped:
            return
        for index in range(len(self._rows) - 1, -1, -1):
            row_step, stats, _ = self._rows[index]
            if row_step == step:
                self._rows[index] = (row_step, stats, loss)
                return
            if row_step < step:
                break
        if self._fed_step is not None and step <= self._fed_step:
            self._stop(f"the loss of step {step} came after that step was digested")

    def hand_over_rest(self) -> None:
        """Hands the steps added so far to the digest, to be recorded (at close; then `wait`
        without the writer's lock, which the records take)."""
        if not self._stopped and self._rows and self._handed + len(self._rows) >= EVERY_STEPS:
            self._hand_over()

    def wait(self) -> None:
        """Waits for the records handed over so far to be written."""
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.result()

    def _hand_over(self):
        rows, self._rows = self._rows, []
        self._handed += len(rows)
        self._fed_step = rows[-1][0]
        epochs = (list(self._epochs[0]), list(self._epochs[1]))
        self._submit(self._record, rows, epochs)

    def _submit(self, job, *args):
        with self._jobs_lock:
            self._jobs = [done for done in self._jobs if not done.done()]
            self._jobs.append(self._worker.submit(job, *args))

    def _record(self, rows, epochs):
        """Feeds ``rows`` to the digest and writes the record (in the worker thread)."""
        if self._stopped:
            return
        try:
            if self._digest is None:
                like = series_from_points("", self._tag, self._parsed, ())
                self._digest = digest.Digest(like, analysis.Thresholds(),
                                             block_steps=FIRST_BLOCK_STEPS)
                self._written = digest.Written()
            self._digest.set_epochs(*epochs)
            rows_series = series_from_points(
                "", self._tag, self._parsed, [(step, 0.0, stats) for step, stats, _ in rows])
            self._digest.feed(with_loss(rows_series, loss_curve(
                "", self._tag, [(step, 0.0, loss) for step, _, loss in rows if loss is not None]),
                metadata.loss_tag(self._parsed.name)))
            arrays, written = self._digest.record(self._written)
            arrays["analysis"] = digest.analysis_identity(self._digest.thresholds)
            arrays["writer"] = self._id
            blocks = {name: arrays.pop(name) for name in digest.BLOCK_ARRAYS}
            payloads = {metadata.DIGEST_TAG_SUFFIX: metadata.encode_digest(arrays),
                        metadata.DIGEST_BLOCKS_TAG_SUFFIX: metadata.encode_digest(blocks)}
            if not self._emit(payloads, rows[-1][0]):
                self._stop("a digest record could not be written")
                return
            self._written = written
            self._records += 1
        except Exception as error:  # noqa: BLE001 - training must not die of its digest
            self._stop(f"{type(error).__name__}: {error}")

    def _stop(self, why: str):
        """Stops the digest; records already written are voided (readers read the steps)."""
        if self._stopped:
            return
        self._stopped = True
        self._rows = []
        logger.info("tensorboard-gradients stops the digest of %r (%s): TensorBoard will read "
                    "its steps instead", self._tag, why)
        self._submit(self._void)

    def _void(self):
        """Voids the records written (after every record handed over before, in the worker)."""
        if not self._records:
            return
        try:
            self._emit({metadata.DIGEST_TAG_SUFFIX: metadata.encode_digest(
                {"void": np.int64(1), "writer": self._id})}, None)
        except Exception:  # noqa: BLE001 - a strict writer's OSError: training must go on
            logger.exception("tensorboard-gradients could not void the digest of %r", self._tag)
