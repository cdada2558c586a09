"""`GradientWriter`: the TF-free writer (numpy arrays in, TensorBoard event files out).

Writes exactly what the TensorFlow summary op writes for the same inputs (same tags, metadata,
matrix layout and statistics), without importing TensorFlow: for PyTorch, JAX and numpy users,
and under the training monitors and the TensorFlow op, which all write through it.

Write failures never stop training by default: a multi-day run must not die because its log
disk filled. A step whose events cannot be written (full disk, quota, read-only or vanished
directory, permissions) is dropped whole (never a torn record, see
`event_files.EventFileWriter`), an error naming the path is logged at the first failure of each
outage, every later step tries again, and when writing works again the writer logs how many
steps were lost and records the running total as the scalar ``<name>/dropped_steps``.
``strict=True`` raises the `OSError` instead.

A run directory may be an fsspec URL (``s3://bucket/logs/run1``): the events go up as whole
objects, one every 30 s and at `flush` and `close`, read as one file (`segments`). An upload that
fails is kept and tried again; steps that cannot be kept (`segments.KEPT_BYTES`) or are still
refused at `close` are dropped, counted and reported like those a full disk refused.

Off the training thread: a write checks its arguments and returns; building the step's events,
writing them and feeding the digest and the alert judgement happen in order on the writer's
background thread (`write_queue.WriteQueue`, every second the writes queued meanwhile). Its queue
holds `QUEUE_LENGTH` writes: a loop that
logs faster than they run waits for them, a little each time; when the disk stalls, a write is not
waited for but dropped, counted and reported like a step a full disk refused. `flush`, `close` and
`alerts(wait=True)` first wait for the queued writes; with ``strict=True`` (an error must reach the
write that failed) or ``on_alert`` (a step's judgement must be in before the next step) the caller
waits for each write.

Each stats tag's digest (`digest_feed.DigestFeed`: the classes, alerts and block summaries the
plugin shows) is kept in a background thread and written every 1,000 steps and at close, so
TensorBoard opens runs of 100,000 steps at once; ``digest=False`` leaves it out.
"""

import logging
import os
import threading
import time
from typing import List, Mapping, Optional

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tensorboard_gradients.format import (
    alert_feed, columns, digest_feed, metadata, run_tags, segments, statistics, storage, wire,
    write_queue,
)
from tensorboard_gradients.format.layout import Layout, LayoutTags, MissingGradientWarnings
from tensorboard_gradients.format.tensors import (
    as_float_array, check_histogram_shape, check_stats_shape, loss_value, tensor_proto)

logger = logging.getLogger(__name__)

# The most writes waiting for the background thread (a step's statistics are one, its scalars
# another): about 100 steps of a 1,000-variable model's statistics and histograms, ~60 MB.
QUEUE_LENGTH = 200


def run_directory(log_dir) -> str:
    """The run directory named by ``log_dir``: a path, or a writer that already logs a run there.

    Accepted writers, found by their interface so no framework is imported:
    `torch.utils.tensorboard.SummaryWriter` (``get_logdir()``), tensorboardX's ``SummaryWriter``
    (``logdir``) and Lightning's ``TensorBoardLogger`` (``log_dir``). The gradients then go to the
    same run as that writer's scalars, so TensorBoard shows the loss and the Gradients tab of
    one run side by side (in an event file of their own: TensorBoard reads every file of a run).

    Raises:
      ValueError: anything else (with what was given).
    """
    if callable(getattr(log_dir, "get_logdir", None)):
        log_dir = log_dir.get_logdir()
    elif not isinstance(log_dir, (str, bytes, os.PathLike)):
        for attribute in ("logdir", "log_dir"):
            if isinstance(getattr(log_dir, attribute, None), (str, os.PathLike)):
                log_dir = getattr(log_dir, attribute)
                break
    try:
        return os.fsdecode(os.fspath(log_dir))
    except TypeError:
        raise ValueError(
            "log_dir must be a directory path or a SummaryWriter (torch.utils.tensorboard or "
            f"tensorboardX), got {type(log_dir).__name__}") from None


class GradientWriter:
    """Logs per-variable gradient statistics for one model to ``logdir``.

    Example:

    ```python
    with GradientWriter("logs/run1") as writer:
        for step in range(steps):
            grads = ...  # {"dense/kernel": np.ndarray, ...}, model order (input side first)
            writer.write(step, grads, weights=params, histograms=step % 100 == 0)
    ```

    Args:
      logdir: the run directory (TensorBoard shows its path relative to ``--logdir``), or a
        `torch.utils.tensorboard` / tensorboardX ``SummaryWriter`` whose run to join (see
        `run_directory`). The event file is created on the first `write`, so constructing a
        writer touches no disk. An fsspec URL (``s3://bucket/logs/run1``) writes to a bucket
        (see the module).
      name: the summary name = the tag (see `metadata` for the ``_varset<k>`` rule when the
        variable set changes).
      strict: raise the `OSError` when events cannot be written; each write is then made on the
        calling thread, so the error reaches the write that failed. By default (False) writes
        run on the writer's background thread and a step that cannot be written is dropped,
        counted (`dropped_steps`) and reported, and training goes on (see the module).
      digest: also write each stats tag's digest (see the module); it costs a background thread
        about 0.2-0.3 ms of CPU per step for 1,000 variables, and 2.5 bytes per variable and step
        on disk (benchmarks/NOTES.md).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm only when named.
      on_alert: called with each new `analysis.Alert` (a finding, or a finding grown more
        urgent) as the run is written, on the thread that writes: a write of step ``t + 1``
        first waits for the judgement of the steps up to ``t`` (see `alert_feed`; the last
        steps at `close`), then calls it with what they raised. Whatever it raises reaches the
        caller of the write: a loop can act on an alert (skip a batch, lower the rate,
        checkpoint, stop). The wait costs the training thread the judgement of each logged
        step (benchmarks/RESULTS.md, the PyTorch monitor's ``on_alert=`` column); without
        ``on_alert`` nothing waits. See also `alerts`.
    """

    def __init__(self, logdir, name: str = metadata.DEFAULT_NAME, strict: bool = False,
                 digest: bool = True, stats=None, on_alert=None):
        selected = columns.selected_stats(stats)
        self._gradient_stats = columns.gradient_stats(selected)
        self._logs_weights = "weight_l2_norm" in selected
        self._events = segments.event_writer(run_directory(logdir), strict, self._segment_due,
                                             self._segment_lost)
        self._name = name
        self._strict = bool(strict)
        self._digest = bool(digest)
        self._feeds = {}  # stats tag -> DigestFeed
        self._alert_feeds = {}  # stats tag -> AlertFeed
        if on_alert is not None and not callable(on_alert):
            raise ValueError(f"on_alert must be callable, got {type(on_alert).__name__}")
        self._on_alert = on_alert
        self._new_alerts = []  # every new alert, in the order judged
        self._alerts_returned = 0  # of them returned by `alerts`
        self._alerts_called = 0  # of them passed to on_alert
        self._closed = False  # closed and not written since: every step written is final
        self._epochs = []  # (step, epoch) marks written, for the digests of tags made later
        self._tags = None  # LayoutTags, seeded from the run directory at the first write
        self._described = set()
        self._lock = threading.Lock()  # what the background thread and the digests' share
        self._tags_lock = threading.Lock()  # the tags, chosen on the calling thread
        self._drops_lock = threading.Lock()  # the drops, counted on either
        self._queue = write_queue.WriteQueue(QUEUE_LENGTH)
        self._missing = MissingGradientWarnings(logger)
        self._dropped_steps = 0
        self._last_step = 0  # of the last event written
        # While writes fail: the steps dropped since the first failure (a step's several writes,
        # its statistics and its histograms, count once).
        self._outage = None

    @property
    def logdir(self):
        return self._events.logdir

    @property
    def dropped_steps(self) -> int:
        """Steps whose events could not be written (a full disk, ...) or waited for (a queue
        full of writes) since the writer was made; after `flush` or `close`, every write made
        before is counted."""
        return self._dropped_steps

    def _submit(self, step: int, job) -> Optional[int]:
        """Runs ``job`` (the writes of ``step``) on the background thread, or at once when
        errors must reach the caller (``strict``); returns its ticket (None: run, or dropped)."""
        def write_and_upload():
            job()
            self._events.upload()  # a bucket's segment ended by the job, outside the lock

        if self._strict:
            write_and_upload()
            return None
        ticket = self._queue.submit(write_and_upload)
        if ticket is None:
            self._dropped(int(step), None)
        return ticket

    def write(self, step: int, gradients: Mapping[str, Optional[object]],
              weights: Optional[Mapping[str, object]] = None, histograms: bool = False,
              loss=None) -> str:
        """Writes one step's statistics (and, if `histograms`, the |g| distribution).

        Args:
          step: the optimizer step (an int).
          gradients: variable name -> gradient array, in model order (input side first). A None
            gradient is logged as missing (a row of NaN), not as zeros.
          weights: variable name -> value, for the `weight_l2_norm` column (unless the writer's
            ``stats`` leave it out); every variable of `gradients` must have one.
          histograms: also write the log10|g| histograms under ``<tag>_histograms``.
          loss: this step's training loss (a number; NaN and Inf are kept), written under
            ``<name>_loss``: the rules judge the gradients against it (None: not logged).

        Returns:
          The tag written to.
        """
        if not gradients:
            raise ValueError("GradientWriter.write needs at least one gradient")
        names = list(gradients)
        if weights is not None:
            absent = [n for n in names if n not in weights]
            if absent:
                raise ValueError(f"weights missing for variables {absent[:5]}")
        arrays = {n: None if g is None else as_float_array(g, n) for n, g in gradients.items()}
        weight_arrays = (
            None if weights is None else {n: as_float_array(weights[n], n) for n in names}
        )
        self._missing.warn([n for n in names if arrays[n] is None])
        dtype = statistics.NumpyOps.computation_dtype(
            [a.dtype for a in arrays.values() if a is not None]
        )
        shapes = [
            (weight_arrays[n].shape if weight_arrays else None) if arrays[n] is None else arrays[n].shape
            for n in names
        ]
        if not self._logs_weights:
            weight_arrays = None  # their shapes taken, their norms not asked for
        layout = Layout.create(names, shapes, with_weights=weight_arrays is not None,
                               gradient_stats=self._gradient_stats)
        entries = [
            None if arrays[n] is None else (arrays[n].astype(dtype, copy=False), arrays[n].size)
            for n in names
        ]
        ops = statistics.NumpyOps
        with np.errstate(over="ignore", invalid="ignore"):  # overflow routes to the masked pass
            stats = statistics.statistics_matrix(
                ops,
                entries,
                None if weight_arrays is None else [weight_arrays[n].astype(dtype, copy=False) for n in names],
                dtype,
                self._gradient_stats,
            )
            counts = statistics.histogram_matrix(ops, entries, dtype) if histograms else None
        return self.write_statistics(step, layout, stats, counts, loss=loss)

    def write_statistics(self, step: int, layout: Layout, stats: np.ndarray,
                         histogram_counts: Optional[np.ndarray] = None,
                         description: Optional[str] = None, loss=None,
                         scalars: Optional[Mapping[str, float]] = None) -> str:
        """Writes matrices computed elsewhere (e.g. on the accelerator, inside a train step).

        Args:
          step: the step.
          layout: what the rows and columns mean (`Layout`).
          stats: ``[len(layout.variables), len(layout.stats)]``.
          histogram_counts: optional ``[len(layout.variables), columns.HISTOGRAM_BINS]``.
          description: optional, stored with the tag's metadata.
          loss: this step's training loss, as `write`'s.
          scalars: `write_scalars`' scalars of this step, written in the same event (one write
            instead of two).

        Returns:
          The tag written to (also when the step was dropped: see `dropped_steps`).
        """
        check_stats_shape(layout, stats)
        stats = np.array(stats)  # a copy: the caller may reuse its buffers once this returns
        return self.write_statistics_later(step, layout, lambda: (stats, {}), histogram_counts,
                                           description, loss, scalars)

    def write_statistics_later(self, step: int, layout: Layout, finish,
                               histogram_counts: Optional[np.ndarray] = None,
                               description: Optional[str] = None, loss=None,
                               scalars: Optional[Mapping[str, float]] = None) -> str:
        """`write_statistics` of a matrix whose host work is left to the writer's thread:
        ``finish()``, called there (on this thread when ``strict``), returns ``(stats, more
        scalars)``. For a training loop, whose thread then pays only for what must happen
        before the gradients change (the reductions, the copy to the host, the checks that
        may need another pass over them); ``finish`` must read nothing the loop changes later.
        A matrix of the wrong shape is not written: the writer's thread logs why (``strict``:
        raised here). Other arguments and the result as `write_statistics`'s."""
        loss = loss_value(loss)
        scalars = {key: float(value) for key, value in (scalars or {}).items()}
        if histogram_counts is not None:
            check_histogram_shape(layout, histogram_counts)
            histogram_counts = np.array(histogram_counts)
        self._closed = False
        tag = self._tag_for(layout)

        def job():
            stats, more_scalars = finish()
            check_stats_shape(layout, stats)  # a wrong one is not written (the queue logs why)
            with self._lock:
                values = [self._tensor_value(
                    tag, stats, lambda: metadata.stats_metadata_content(self._name, layout),
                    description)]
                if histogram_counts is not None:
                    values.append(self._histogram_value(tag, layout, histogram_counts,
                                                        description))
                if loss is not None:
                    values.append(self._loss_value(loss))
                values += [self._scalar_value(key, float(value))
                           for key, value in {**more_scalars, **scalars}.items()]
                if self._emit(step, values):
                    # `stats` are the values written (`tensor_proto`, no conversion): the digest
                    # and the alerts judge what the readers will read.
                    if self._digest:
                        self._feed(tag, layout).add(int(step), stats, loss)
                    self._alert_feed(tag, layout).add(int(step), stats, loss)

        ticket = self._submit(step, job)
        if self._on_alert is not None:  # the judgement of the steps before needs this one in
            self._queue.wait(ticket)
            self._call_on_alert()
        return tag

    def _alert_feed(self, tag, layout) -> alert_feed.AlertFeed:
        if tag not in self._alert_feeds:
            self._alert_feeds[tag] = alert_feed.AlertFeed(tag, self._name, layout)
        return self._alert_feeds[tag]

    def alerts(self, wait: bool = False) -> List:
        """The `analysis.Alert`s judged since the last call, in the order judged (each
        judgement's most urgent first): findings not returned before, or grown more urgent.
        Judged in the background as steps are written (see `alert_feed`): an alert raised at
        a step is here once the next step is written (the thread writes every second).
        ``wait``: judge every step written before the last one first; after `close`, every
        step written is judged first."""
        if wait or self._closed:
            self._queue.wait()
        self._collect(wait=wait or self._closed, settle=self._closed)
        with self._lock:
            new = self._new_alerts[self._alerts_returned:]
            self._alerts_returned = len(self._new_alerts)
        return new

    def _collect(self, wait=False, settle=False):
        with self._lock:
            feeds = list(self._alert_feeds.values())
        taken = [alert for feed in feeds for alert in feed.take(wait=wait, settle=settle)]
        with self._lock:
            self._new_alerts.extend(taken)

    def _call_on_alert(self):
        """Passes the new alerts to ``on_alert`` (on the writing thread, outside the lock),
        once the steps before this one are judged: a loop acts on the same step whatever the
        machine's speed."""
        if self._on_alert is None:
            return
        self._collect(wait=True)
        while True:
            with self._lock:
                if self._alerts_called >= len(self._new_alerts):
                    return
                alert = self._new_alerts[self._alerts_called]
                self._alerts_called += 1
            self._on_alert(alert)

    def _feed(self, tag, layout) -> digest_feed.DigestFeed:
        if tag not in self._feeds:
            feed = digest_feed.DigestFeed(
                tag, self._name, layout,
                lambda payloads, step: self._write_digest(tag, payloads, step))
            for step, epoch in self._epochs:
                feed.epoch(step, epoch)
            self._feeds[tag] = feed
        return self._feeds[tag]

    def _write_digest(self, tag: str, payloads, step) -> bool:
        """Writes a digest record of ``tag`` (``{tag suffix: payload}``, from its feed's thread)
        as one event at ``step`` (None: the last step written)."""
        with self._lock:
            values = [self._value(tag + suffix, payload, lambda: metadata.create_summary_metadata(
                metadata.digest_metadata_content(self._name), None,
                plugin_name=metadata.DIGEST_PLUGIN_NAME)) for suffix, payload in payloads.items()]
            return self._emit(self._last_step if step is None else step, values)

    def write_histograms(self, step: int, layout: Layout, counts: np.ndarray,
                         description: Optional[str] = None) -> str:
        """Writes a histogram matrix computed elsewhere, for a step without statistics."""
        check_histogram_shape(layout, counts)
        tag = self._tag_for(layout)
        counts = np.array(counts)

        def job():
            with self._lock:
                self._emit(step, [self._histogram_value(tag, layout, counts, description)])

        self._submit(step, job)
        return metadata.histogram_tag(tag)

    def _tag_for(self, layout):
        with self._tags_lock:
            if self._tags is None:
                self._tags = LayoutTags()
                for tag, existing in run_tags.tags_in_run(self.logdir, self._name):
                    self._tags.known(self._name, tag, existing)
            return self._tags.tag_for(self._name, layout)

    def _histogram_value(self, tag, layout, counts, description):
        return self._tensor_value(
            metadata.histogram_tag(tag),
            counts,
            lambda: metadata.histogram_metadata_content(self._name, layout),
            description,
        )

    def write_epoch(self, step: int, epoch: int):
        """Marks that epoch `epoch` (0-based) starts at `step` (tag ``<name>_epochs``)."""
        step, epoch = int(step), int(epoch)

        def job():
            with self._lock:
                tag = metadata.epochs_tag(self._name)
                self._epochs.append((step, epoch))
                for feed in self._feeds.values():
                    feed.epoch(step, epoch)
                self._emit(step, [self._tensor_value(
                    tag, np.array(epoch, dtype=np.float64),
                    lambda: metadata.epochs_metadata_content(self._name), None)])

        self._submit(step, job)

    def write_loss(self, step: int, loss) -> None:
        """Writes the training loss of ``step`` after its statistics (as `write`'s ``loss``
        does with them): for trainers that report the loss once the step is done. A number or
        a one-element tensor; NaN and Inf are kept."""
        loss = loss_value(loss)

        def job():
            with self._lock:
                for feed in self._feeds.values():
                    feed.loss(int(step), loss)
                for feed in self._alert_feeds.values():
                    feed.loss(int(step), loss)
                self._emit(step, [self._loss_value(loss)])

        self._submit(step, job)

    def _loss_value(self, loss: float):
        return self._tensor_value(metadata.loss_tag(self._name), np.array(loss, dtype=np.float64),
                                  lambda: metadata.loss_metadata_content(self._name), None)

    def write_scalars(self, step: int, scalars: Mapping[str, float]):
        """Writes ordinary TensorBoard scalars (Scalars dashboard) under ``<name>/<key>``."""
        scalars = {key: float(value) for key, value in scalars.items()}

        def job():
            with self._lock:
                self._emit(step, [self._scalar_value(key, value)
                                  for key, value in scalars.items()])

        self._submit(step, job)

    def _scalar_value(self, key, value):
        tag = f"{self._name}/{key}"
        if self._undescribed(tag):
            return self._value(tag, np.float32(value),
                               lambda: scalar_metadata.create_summary_metadata(tag, ""))
        return tag, wire.float32_value(tag, value)

    def _tensor_value(self, tag, array, content, description):
        return self._value(
            tag, array, lambda: metadata.create_summary_metadata(content(), description))

    def _value(self, tag, array, summary_metadata):
        """``(tag, the serialized Summary.Value)`` of ``array``: its tag's first in a file with
        its metadata (``summary_metadata()``), by protobuf; the others by `wire`, which
        encodes them in a quarter of the time (a step's event is built on the writer's thread)."""
        if self._undescribed(tag):
            return tag, summary_pb2.Summary.Value(
                tag=tag, tensor=tensor_proto(array), metadata=summary_metadata(),
            ).SerializeToString()
        return tag, wire.tensor_value(tag, array)

    def _undescribed(self, tag) -> bool:
        """Whether ``tag``'s next value carries its metadata: loaders read metadata once per tag,
        and writing it once per file (a bucket's: per segment) keeps events small while every
        file describes itself."""
        if self._events.starts_new_file:
            self._described.clear()
        return tag not in self._described

    def _emit(self, step, values) -> bool:
        """Writes one step's values as one event, or drops the step (see the module); True
        when written."""
        step = int(step)
        with self._drops_lock:
            outage = self._outage
            # Told by a write of a step at or after the first dropped one: the queue may still
            # hold steps from before the drops.
            reported = (None if outage is None or min(outage) > step
                        or self._events.failing is not None  # a bucket still refusing uploads
                        else (len(outage), self._dropped_steps))
        if reported:  # the first write after an outage says how much was lost
            values = values + [self._scalar_value("dropped_steps", reported[1])]
        try:
            self._events.write(wire.EncodedEvent(
                step, wire.event(time.time(), step, [data for _, data in values])))
        except OSError as error:
            if self._strict:
                raise
            self._dropped(step, error)
            return False
        self._last_step = step
        self._described.update(tag for tag, _ in values)
        with self._drops_lock:
            # Steps the queue dropped meanwhile are reported by the next write.
            if reported and len(outage) == reported[0]:
                logger.warning(
                    "tensorboard-gradients writes to %s again from step %d: %d step(s) between "
                    "steps %d and %d were dropped (%d in all)", _shown(self.logdir),
                    step, len(outage), min(outage), max(outage), reported[1],
                )
                self._outage = None
        return True

    def _segment_lost(self, steps, error):
        """Counts the steps of a bucket's segment that could not be uploaded (`segments`)."""
        with self._drops_lock:
            for step in sorted(steps):
                self._count_dropped(step, error)

    def _segment_due(self):
        """A bucket's segment is `segments.SEGMENT_SECONDS` old and no write came to end it:
        the background thread ends and uploads it (in turn with the writes)."""
        def job():
            with self._lock:
                self._events.seal(due_only=True)
            self._events.upload()

        self._queue.submit(job)

    def _dropped(self, step, error):
        """Counts ``step`` as dropped (its events refused with ``error``, or with None not
        queued: the background thread is `QUEUE_LENGTH` writes behind)."""
        with self._drops_lock:
            self._count_dropped(step, error)

    def _count_dropped(self, step, error):
        if self._outage is None:
            self._outage = set()
            reason = (f"{QUEUE_LENGTH} writes are stuck waiting for the disk" if error is None
                      else error.strerror or error)
            logger.error(
                "tensorboard-gradients cannot write to %s (%s): gradient statistics are NOT "
                "being logged from step %d on; training continues and every later step tries "
                "again (pass strict=True to raise instead)",
                _shown(self.logdir), reason, step,
            )
        if step not in self._outage:
            self._outage.add(step)
            self._dropped_steps += 1

    def flush(self, upload: bool = True):
        """Writes what is queued and flushes the event file.

        upload: for a bucket, also end the segment being filled and upload it, on this thread
          (False: it goes up when due, `segments.SEGMENT_SECONDS`); a local file has nothing to
          upload.
        """
        self._queue.wait()
        if not upload:
            return
        with self._lock:
            self._events.flush()
        self._events.upload(force=True)

    def close(self):
        """Writes the digests' last records, judges the last steps (``on_alert``) and closes the
        event file; a later write starts a new, self-describing file."""
        self._queue.wait()
        if self._on_alert is not None:  # else the last steps are judged when alerts are asked
            self._collect(settle=True)
            self._call_on_alert()
        self._closed = True
        with self._lock:
            feeds = list(self._feeds.values())
            for feed in feeds:
                feed.hand_over_rest()
        for feed in feeds:  # their records take the lock
            feed.wait()
        with self._lock:
            self._events.close()
            self._described.clear()
            if self._outage is not None:
                logger.error("tensorboard-gradients: %d step(s) could not be written to %s",
                             self._dropped_steps, _shown(self.logdir))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _shown(logdir: str) -> str:
    """A run directory as messages name it: an absolute path, or a URL without credentials."""
    return storage.shown(logdir) if storage.is_url(logdir) else os.path.abspath(logdir)
