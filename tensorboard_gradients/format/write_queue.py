"""`WriteQueue`: a writer's event writes run in order on a background thread, off the thread that
trains.

Building a step's protocol buffers, writing them to the event file and feeding the digest and the
alert judgement take a fraction of a millisecond to several (a slow or networked disk): none of it
needs to hold up the training step that logged the matrices. The queue is bounded: when its thread
is full, `submit` waits for a slot at most `PATIENCE_SECONDS` (a loop that logs faster than its
writes run is slowed to their pace: each takes a millisecond or less); a slot that takes longer
means the thread is stuck (a disk that stalls), and from then on `submit` refuses jobs at once,
until the queue is half empty again, and the writer drops and counts those steps as it does steps
a full disk refused. The thread runs the jobs queued meanwhile every `BATCH_SECONDS`, back to
back (at once for a caller that waits for them, or when the queue is half full): not a thread
switch per training step. It starts with the first job and ends after a second without one, so
idle writers hold no thread; at interpreter exit every queue still holding jobs is drained
first.
"""

import atexit
import collections
import logging
import threading
import time
import weakref
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# How long the thread waits for another job before it ends (seconds): a training loop logs far
# more often, so the thread lives as long as the run logs, and a writer left idle holds none.
IDLE_SECONDS = 1.0

# How often the thread runs the jobs queued meanwhile (seconds), unless the queue is half full or
# a caller waits for them: woken at every job, the thread took 0.30 ms of CPU per training step
# of the PyTorch benchmark (a thread switch and cold caches each time, on a core the training
# uses), against 0.06 ms per job run back to back (benchmarks/NOTES.md, "The weight norms at the
# full steps; writes in batches"). In the training loop, where every batch starts with caches
# the step emptied, the longer the batch the less each job costs: for the benchmark's clipped
# norms-only steps 0.25-0.35 ms at 0.05 s, 0.13-0.17 at 0.25 s, 0.08-0.10 at 1 s and 0.07 at 2 s
# (NOTES, "Cold caches, not Python" and "Writes every second"). Still below what a reader
# notices (TensorBoard reloads every 5 s at the most); a process killed without its exit
# handlers loses the steps of the last second at most.
BATCH_SECONDS = 1.0

# The longest `submit` waits for a slot in a full queue before it takes the thread for stuck: a
# write takes a millisecond or less, and a busy machine may not run the thread for tens of ms;
# a stalled disk costs the loop this wait once, then drops are immediate.
PATIENCE_SECONDS = 0.2

_LIVE = weakref.WeakSet()  # queues that may hold jobs, drained at exit


class WriteQueue:
    """Runs jobs (callables without arguments) one at a time, in the order submitted, on one
    thread of its own.

    Args:
      limit: the most jobs waiting at once; `submit` refuses more.
      name: the thread's name (shown by debuggers and ``threading.enumerate()``).
      batch_seconds: how often the thread runs the jobs queued meanwhile (`BATCH_SECONDS`).
    """

    def __init__(self, limit: int, name: str = "tensorboard-gradients writer",
                 batch_seconds: float = BATCH_SECONDS):
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._name = name
        self._batch_seconds = batch_seconds
        self._jobs = collections.deque()
        self._condition = threading.Condition()
        self._thread = None
        self._submitted = 0  # jobs submitted so far; a job's number is its ticket
        self._done = 0  # jobs run so far (in order: every ticket up to it has run)
        self._stuck = False  # a full queue did not move for PATIENCE_SECONDS
        self._callers_waiting = 0  # in `wait` or a full `submit`: the thread runs the jobs now

    def submit(self, job: Callable[[], None]) -> Optional[int]:
        """Queues ``job``; returns its ticket, or None (not queued) when the queue is stuck full
        (see the module)."""
        with self._condition:
            if self._stuck and len(self._jobs) <= self._limit // 2:
                self._stuck = False
            if len(self._jobs) >= self._limit and not self._stuck:
                self._callers_waiting += 1
                self._condition.notify_all()
                self._condition.wait_for(lambda: len(self._jobs) < self._limit,
                                         PATIENCE_SECONDS)
                self._callers_waiting -= 1
                self._stuck = len(self._jobs) >= self._limit
            if self._stuck:
                return None
            self._jobs.append(job)
            self._submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                _LIVE.add(self)
            elif self._urgent():
                self._condition.notify_all()
            return self._submitted

    def wait(self, ticket: Optional[int] = None) -> None:
        """Returns once job ``ticket`` (default: every job submitted so far) has run."""
        with self._condition:
            target = self._submitted if ticket is None else ticket
            self._callers_waiting += 1
            self._condition.notify_all()
            while self._done < target:
                self._condition.wait()
            self._callers_waiting -= 1

    @property
    def waiting(self) -> int:
        """Jobs submitted and not yet run."""
        with self._condition:
            return self._submitted - self._done

    def _urgent(self) -> bool:
        """Whether the thread should run the queued jobs now, not at its next batch."""
        return self._callers_waiting > 0 or len(self._jobs) >= self._limit // 2

    def _run(self):
        last_job, draining = time.monotonic(), False
        while True:
            with self._condition:
                # The jobs of BATCH_SECONDS run together; with none queued the thread waits
                # whatever a caller does (no spinning while a satisfied `wait` returns).
                if not (draining or self._jobs and self._urgent()):
                    self._condition.wait(self._batch_seconds)
                draining = bool(self._jobs)
                if not draining:
                    if time.monotonic() - last_job >= IDLE_SECONDS:
                        self._thread = None  # the next submit starts another
                        return
                    continue
                job = self._jobs[0]
            try:
                job()
            except Exception:  # a bug in a job must not end the thread and strand the others
                logger.exception("tensorboard-gradients: a write failed")
            last_job = time.monotonic()
            with self._condition:
                self._jobs.popleft()
                self._done += 1
                self._condition.notify_all()


@atexit.register
def drain_at_exit():
    """Runs the jobs still queued when Python exits (a run that never closed its writer keeps
    every step it logged, as when the writes were made at once)."""
    for queue in list(_LIVE):
        queue.wait()
