"""`AlertFeed`: the alerts of a stats tag while it is written, for a training loop to act on.

Every monitor's ``alerts()`` and ``on_alert`` come from here (through `GradientWriter.alerts`).
The writer hands the feed each step it writes, as written, with its loss; a background thread
judges them with `analysis.AnalysisStream`, the analysis the plugin and the CLI run, so the
alerts are `analysis.diagnose` of the steps so far, each raised at the step the analysis fed
step by step raises it (`Alert.raised_step`). The training thread only appends rows.

* A step is judged once the next one is written (or at `settle`): a loss reported after its
  step (`GradientWriter.write_loss`) still joins it. An alert raised at step ``t`` is therefore
  known after step ``t + 1`` is written: with ``on_alert`` that write waits for it (the loop
  acts at the same step on any machine), ``alerts(wait=True)`` too; ``alerts()`` returns what
  is judged by then.
* Until someone asks (``on_alert``, `take`), the thread only feeds the steps to the analysis,
  `CHUNK_ROWS` at a time (what the digest costs), and draws no alerts. Once asked, it judges
  what came since its last turn in one go and rests between turns at least `REST_FACTOR` times
  as long as the turn took: it takes at most a fifth of a core, whatever the run's length (a
  turn's whole-run rules grow with it: 25 ms at 3,000 steps of 100 variables), and alerts are
  late by at most that rest.
* New alerts: a finding not delivered before, or delivered at a less urgent severity.
* A failure of the thread is logged once and stops the feed; it never raises into training.
  Between steps the thread waits (a daemon: it never holds the process), so a writer closed and
  written again goes on judging the same run.
"""

import logging
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis.stream import AnalysisStream
from tensorboard_gradients.format.series import GradientSeries

logger = logging.getLogger(__name__)

# The thread rests this many times as long as its last turn took.
REST_FACTOR = 4.0
# Steps fed to the analysis at a time while nobody has asked for alerts.
CHUNK_ROWS = 256


def alert_identity(alert) -> Tuple:
    """What makes two alerts the same finding (its severity may grow)."""
    return (alert.kind, alert.rule, alert.variable, alert.layer, alert.first_step)


class AlertFeed:
    """The live alerts of one stats tag of ``layout`` (judged with the default thresholds)."""

    def __init__(self, tag: str, name: str, layout):
        like = GradientSeries(
            run=".", tag=tag, name=name, variables=layout.variables, layers=layout.layers,
            shapes=layout.shapes, stat_names=layout.stats, steps=np.zeros(0, np.int64),
            wall_times=np.zeros(0), values=np.zeros((0, len(layout.variables),
                                                      len(layout.stats)), np.float32),
            stats_every=layout.stats_every, every_step=layout.every_step)
        self._stream = AnalysisStream(like)
        self._last = None  # (step, stats, loss) written last, not handed over yet
        self._queue: List[tuple] = []  # rows handed over, not judged yet
        self._judging = 0  # rows the thread is judging now
        self._delivered: Dict[Tuple, int] = {}  # identity -> severity rank delivered
        self._ready: List[analysis.Alert] = []
        self._stopped = False
        self._waiters = 0  # `take(wait=True)` calls waiting: the thread does not rest
        self._asked = False  # someone took alerts: from then on every turn draws them
        self._stale = False  # steps fed since the alerts were last drawn
        self._changed = threading.Condition()
        self._thread = None

    def add(self, step: int, stats: np.ndarray, loss: Optional[float]) -> None:
        """Takes a step just written (steps increase; a step written again or earlier stops
        the feed, as it stops the digest)."""
        with self._changed:
            if self._stopped:
                return
            if self._last is not None:
                if step <= self._last[0]:
                    self._stop(f"step {step} was written after step {self._last[0]}")
                    return
                self._queue.append(self._last)
                self._start()
                # Woken only with work to do: woken at every step to find none, the thread
                # switched in and out once a step and took the GIL from the writer each time
                # (benchmarks/NOTES.md, "The alert thread woken only with work").
                if self._due():
                    self._changed.notify_all()
            self._last = (int(step), np.asarray(stats), loss)  # as written (float64 kept)

    def loss(self, step: int, loss: float) -> None:
        """Takes a loss written after its step (joins the step if not judged yet)."""
        with self._changed:
            if self._last is not None and self._last[0] == step:
                self._last = (step, self._last[1], loss)

    def take(self, wait: bool = False, settle: bool = False) -> List[analysis.Alert]:
        """The alerts not delivered yet, most urgent first. ``wait``: after the thread judged
        every step handed over; ``settle`` also hands over the last step written (at close)."""
        with self._changed:
            self._asked = True
            if settle and self._last is not None and not self._stopped:
                self._queue.append(self._last)
                self._last = None
                self._start()
                self._changed.notify_all()
            if wait or settle:
                self._waiters += 1
                self._changed.notify_all()
                while (self._queue or self._judging or self._stale) and not self._stopped:
                    self._changed.wait()
                self._waiters -= 1
            ready, self._ready = self._ready, []
        return ready

    def _start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="tensorboard-gradients alerts")
            self._thread.start()

    def _due(self) -> bool:
        """Whether the thread has work: steps to feed (at once when asked, else a chunk), or
        alerts to draw for someone who asked."""
        wanted = self._asked or self._waiters
        return bool(self._queue and (wanted or len(self._queue) >= CHUNK_ROWS)
                    or self._stale and wanted)

    def _run(self):
        while True:
            with self._changed:
                while not self._stopped and not self._due():
                    self._changed.wait()
                if self._stopped:
                    return
                rows, self._queue = self._queue, []
                self._judging = len(rows)
                draw = bool(self._asked or self._waiters)
            started = time.monotonic()
            try:
                if rows:
                    self._feed(rows)
                alerts = self._stream.alerts() if draw else None
            except Exception:  # never into training: the feed stops, the run goes on
                logger.exception("tensorboard-gradients: live alerts stopped")
                with self._changed:
                    self._stopped = True
                    self._changed.notify_all()
                return
            with self._changed:
                self._stale = self._stale or bool(rows)
                if alerts is not None:
                    self._keep_new(alerts)
                    self._stale = False
                self._judging = 0
                self._changed.notify_all()
                rest_until = time.monotonic() + REST_FACTOR * (time.monotonic() - started)
                while (not self._stopped and time.monotonic() < rest_until
                       and not self._waiters):
                    self._changed.wait(max(0.0, rest_until - time.monotonic()))

    def _feed(self, rows):
        steps = np.array([row[0] for row in rows], np.int64)
        losses = [row[2] for row in rows]
        logged = np.array([loss is not None for loss in losses])
        self._stream.feed(
            steps, np.zeros(len(rows)), np.stack([row[1] for row in rows]),
            loss=np.array([np.nan if loss is None else loss for loss in losses], np.float64),
            loss_logged=logged)

    def _keep_new(self, alerts):
        for alert in alerts:
            identity = alert_identity(alert)
            rank = analysis.SEVERITIES.index(alert.severity)  # 0: the most urgent
            if identity in self._delivered and self._delivered[identity] <= rank:
                continue
            self._delivered[identity] = rank
            self._ready.append(alert)

    def _stop(self, why: str):
        logger.warning("tensorboard-gradients: live alerts stopped: %s", why)
        self._stopped = True
        self._changed.notify_all()
