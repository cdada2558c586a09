"""`Evidence`: one series under one set of thresholds as the rules see it.

It holds what several rules share (norms, missing and non-finite cells, the global norm) and
every rule's results, each computed at most once and only when some rule or `classify` asks:
a rule that depends on another's findings (the spike rule ignores vanishing cells) simply asks
for them, so the registry's order is the order of alerts, not an order of evaluation.
"""

import functools

import numpy as np

from tensorboard_gradients.analysis.classes import NONFINITE


class Evidence:
    """One series (``series``) under one `Thresholds` (``thresholds``), for ``rules``.

    In a stream (`analysis.stream`) the series is one round's rows: ``first_row`` is the run's
    row number of its first row, its rows before ``fresh`` are context (earlier rows that the
    rules look back on), ``previous`` is what rules kept for this round (`kept`) and
    ``resume_row`` is the run's row, a multiple of ``spike_window``, where the next round's
    fresh rows begin: rules `keep` what that round needs. A whole series is one round with
    no context, nothing kept and no next round.
    """

    def __init__(self, series, thresholds, rules, first_row: int = 0, fresh: int = 0,
                 previous=None, resume_row=None):
        self.series = series
        self.thresholds = thresholds
        self.rules = rules
        self.first_row = first_row
        self.fresh = fresh
        self.resume_row = resume_row
        self._previous = previous or {}
        self.next = {}
        self._results = {}
        self._class_cells = {}

    def kept(self, key):
        """What a rule `keep`-ed under ``key`` in the round before (None: nothing)."""
        return self._previous.get(key)

    def keep(self, key, value):
        """Hands ``value`` to the next round of the stream (see `kept`)."""
        self.next[key] = value

    def once(self, compute):
        """``compute(self)``, computed on the first request only.

        ``compute`` is a rule's method (bound methods of one rule compare equal), so a rule can
        share an intermediate result between its `Rule.cells` and its `Rule.alerts`.
        """
        if compute not in self._results:
            self._results[compute] = compute(self)
        return self._results[compute]

    def cells(self, rule) -> np.ndarray:
        """``bool[steps, variables]``: the cells ``rule`` flags (never write to it)."""
        return self.once(rule.cells)

    def cells_of_class(self, code: int) -> np.ndarray:
        """``bool[steps, variables]``: the cells any rule gives the class ``code`` (read-only).

        A rule may ask for the classes of rules that do not ask for its own (no cycles).
        """
        if code not in self._class_cells:
            masks = [self.cells(rule) for rule in self.rules if rule.cell_class == code]
            self._class_cells[code] = (
                functools.reduce(np.logical_or, masks) if masks
                else np.zeros(self.missing.shape, dtype=bool)
            )
        return self._class_cells[code]

    @functools.cached_property
    def norms(self) -> np.ndarray:
        """``float64[steps, variables]``: each gradient's L2 norm as logged (NaN: missing)."""
        return np.asarray(self.series.stat("l2_norm"), dtype=np.float64)

    @functools.cached_property
    def missing(self) -> np.ndarray:
        """``bool[steps, variables]``: no gradient at that step (``size`` is NaN only then)."""
        return np.isnan(self.series.stat("size"))

    @property
    def nonfinite(self) -> np.ndarray:
        """``bool[steps, variables]``: gradients with NaN/Inf entries (read-only)."""
        return self.cells_of_class(NONFINITE)

    @functools.cached_property
    def finite_norms(self) -> np.ndarray:
        """`norms`, NaN where the gradient had NaN/Inf entries.

        The norm of a gradient with NaN/Inf entries covers only its finite entries (0 when none
        is): it says nothing about vanishing or spiking, so those rules see no value there.
        """
        return np.where(self.nonfinite, np.nan, self.norms)

    @functools.cached_property
    def global_norm(self) -> np.ndarray:
        """``[steps]``: ``sqrt(sum of squared variable norms)``, what gradient clipping acts on."""
        with np.errstate(over="ignore", invalid="ignore"):
            return np.sqrt(np.nansum(self.norms**2, axis=1))

    @functools.cached_property
    def loss(self) -> np.ndarray:
        """``float64[steps]``: the training loss logged at each step (NaN where none was, and
        where it was NaN: `loss_logged` tells them apart)."""
        loss = getattr(self.series, "loss", None)
        return np.full(len(self.series.steps), np.nan) if loss is None else loss

    @functools.cached_property
    def loss_logged(self) -> np.ndarray:
        """``bool[steps]``: steps at which a loss was logged."""
        logged = getattr(self.series, "loss_logged", None)
        return np.zeros(len(self.series.steps), bool) if logged is None else logged

    @functools.cached_property
    def global_present(self) -> np.ndarray:
        """``bool[steps]``: steps whose global norm means something (logged, all finite)."""
        return ~self.missing.all(axis=1) & ~self.nonfinite.any(axis=1)
