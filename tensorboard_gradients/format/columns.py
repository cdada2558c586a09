"""What each column of the logged matrices means: THE table of statistics, and the histogram bins.

Every statistic is one `Stat` row of `STATS`, everything a statistic needs besides its formula:
its name (the metadata's ``stats`` entry and the column's key everywhere), what the tab calls it,
how the tab scales its colours, how a layer combines it (the tab's Layers view), the passes over
the entries its formula reads, and when it is there. Writers, the reader, the analysis, the
plugin and the tab (which receives this table from the ``thresholds`` route, see
`server.vocabulary`) all find a column by name here; none of them counts positions. A new
statistic is a row here (``since`` the next minor format version, which `metadata.FORMAT_VERSION`
then names) plus its formula in `statistics`.

Stats-matrix columns are, in order: the gradient stats a writer was asked for (`gradient_stats`:
`GRADIENT_STATS` by default, never fewer than `REQUIRED_STATS`), `WEIGHT_STATS` (when the
variables' values are known), `UPDATE_STATS` (when the writer sees the optimizer's update),
`OPTIMIZER_STATS` (when it reads an Adam-family optimizer's second moment); a writer given
``stats=`` logs the last three only when named there (`selected_stats`).
`DERIVED_STATS` are ratios computed on read, never stored.
"""

import dataclasses
from typing import Sequence, Tuple

import numpy as np

from tensorboard_gradients.analysis import layers

# When a statistic is there.
GRADIENT = "gradient"  # always logged
WEIGHT = "weight"  # logged when the variables' values are known
UPDATE = "update"  # logged when the writer sees the optimizer's update
OPTIMIZER = "optimizer"  # logged when the writer reads an Adam-family optimizer's state
DERIVED = "derived"  # computed on read from two logged columns

# How the tab maps values to colours: magnitudes on log10, signed values, fractions and counts
# linearly (the tab's `makeScale` implements each).
LOG, LINEAR, FRACTION, COUNT = "log", "linear", "fraction", "count"


@dataclasses.dataclass(frozen=True)
class Stat:
    """One statistic: a column of the stats matrix, or a ratio of two of them."""

    name: str
    label: str  # short, for the tab's stat picker, legend and tooltips
    scale: str  # LOG, LINEAR, FRACTION or COUNT
    group: str  # GRADIENT, WEIGHT, UPDATE, OPTIMIZER or DERIVED
    description: str
    # How a layer combines its variables' values, exactly as if its gradients were one tensor:
    # one of `analysis.layers.KINDS` (no default: a stat without one would show NaN by layer).
    layer_combination: str
    # The `statistics.MATRIX_REDUCTIONS` its formula reads (`statistics.passes_for`): none for
    # the counts and size (the masked pass counts non-finite entries; a finite sum of squares
    # proves there are none) and for the weight and update norms (their own pass).
    passes: Tuple[str, ...] = ()
    inputs: Tuple[str, ...] = ()  # DERIVED: (numerator, denominator)
    heatmap: bool = True  # offered as a heatmap in the tab (``size`` is constant: shown in details)
    # The format version that added it (`metadata.FORMAT_VERSION`): files written before lack it.
    since: Tuple[int, int] = (1, 0)
    # Logged by every writer whatever it was asked for (`REQUIRED_STATS`): what the diagnosis of
    # vanishing, exploding and non-finite gradients needs, and the cheapest set to compute.
    required: bool = False
    # Logged at every logged step, also the norms-only steps between two steps with every
    # statistic (a monitor's ``stats_every_n_steps``, format 1.6: `EVERY_STEP_STATS`).
    every_step: bool = False

    def __post_init__(self):
        if self.layer_combination not in layers.KINDS:
            raise ValueError(f"stat {self.name!r}: layer_combination {self.layer_combination!r} "
                             f"is not one of {layers.KINDS}")


# Finite statistics are over the finite entries only; the counts say how many entries were NaN /
# +-Inf; `size` counts every entry of the dense gradient.
STATS = (
    Stat("l2_norm", "L2 norm", LOG, GRADIENT, "L2 norm of the gradient's finite entries",
         layers.ROOT_SUM_SQUARES, passes=("sum_squares",), required=True, every_step=True),
    Stat("mean", "mean", LINEAR, GRADIENT, "mean of the finite entries", layers.FINITE_WEIGHTED,
         passes=("sum",)),
    # Pooled by layer with the means: a std logged without the mean has no value by layer.
    Stat("std", "std", LOG, GRADIENT, "standard deviation of the finite entries",
         layers.POOLED_STD, passes=("sum", "m2")),
    Stat("min", "min", LINEAR, GRADIENT, "smallest finite entry", layers.SMALLEST,
         passes=("min",), required=True),
    Stat("max", "max", LINEAR, GRADIENT, "largest finite entry", layers.LARGEST,
         passes=("max",), required=True),
    Stat("abs_max", "max |g|", LOG, GRADIENT, "largest finite |entry|", layers.LARGEST,
         passes=("min", "max"), required=True),
    Stat("mean_abs", "mean |g|", LOG, GRADIENT, "mean of the finite |entries|",
         layers.FINITE_WEIGHTED, passes=("sum_abs",)),
    Stat("zero_fraction", "zero fraction", FRACTION, GRADIENT,
         "fraction of the entries that are exactly zero", layers.SIZE_WEIGHTED,
         passes=("zeros",)),
    Stat("nan_count", "NaN count", COUNT, GRADIENT, "entries that are NaN", layers.SUM,
         required=True, every_step=True),
    Stat("inf_count", "Inf count", COUNT, GRADIENT, "entries that are +Inf or -Inf", layers.SUM,
         required=True, every_step=True),
    Stat("size", "entries", COUNT, GRADIENT,
         "entries of the dense gradient (NaN: no gradient at this step)", layers.SUM,
         heatmap=False, required=True, every_step=True),
    Stat("weight_l2_norm", "weight L2 norm", LOG, WEIGHT,
         "L2 norm of the variable's values (before the update), over all entries",
         layers.ROOT_SUM_SQUARES, every_step=True),
    # ||w_after - w_before|| of the step: the update/weight ratio is its real relative size.
    Stat("update_l2_norm", "update L2 norm", LOG, UPDATE,
         "L2 norm of the optimizer's update of the step", layers.ROOT_SUM_SQUARES, since=(1, 1),
         every_step=True),
    # Wortsman et al. 2023 (arXiv 2304.13013, "Stable and low-precision training", section 3.4):
    # g^2 / v is about 1 while Adam's second moment v tracks the gradient; an RMS far above 1
    # means v is out of date (it decays by beta2 each step while the gradient was small) and the
    # update is larger than Adam's normalisation promises, which they saw precede loss spikes.
    # Bounded by 1/sqrt(1 - beta2) (v includes this step's g^2): 31.6 at beta2 0.999.
    # Without Adam's eps, as they define it (`statistics.adam`).
    Stat("adam_rms", "Adam RMS g/sqrt(v)", LOG, OPTIMIZER,
         "RMS over the entries of the gradient / sqrt of Adam's bias-corrected second moment, "
         "this step's gradient included in the moment", layers.ROOT_MEAN_SQUARES,
         since=(1, 5)),
    # grad/weight is what an SGD step scales by the learning rate; update/weight is the step's
    # real relative size (healthy around 1e-3, see `analysis.Thresholds`).
    Stat("grad_weight_ratio", "gradient / weight", LOG, DERIVED,
         "gradient L2 norm / weight L2 norm", layers.RATIO, inputs=("l2_norm", "weight_l2_norm")),
    Stat("update_weight_ratio", "update / weight", LOG, DERIVED,
         "update L2 norm / weight L2 norm", layers.RATIO,
         inputs=("update_l2_norm", "weight_l2_norm")),
)
BY_NAME = {stat.name: stat for stat in STATS}

GRADIENT_STATS = tuple(s.name for s in STATS if s.group == GRADIENT)
WEIGHT_STATS = tuple(s.name for s in STATS if s.group == WEIGHT)
UPDATE_STATS = tuple(s.name for s in STATS if s.group == UPDATE)
OPTIMIZER_STATS = tuple(s.name for s in STATS if s.group == OPTIMIZER)
# name -> (numerator stat, denominator stat)
DERIVED_STATS = {s.name: s.inputs for s in STATS if s.group == DERIVED}
# What every stats tag holds, whichever version and writer wrote it: what readers and the
# analysis may rely on. Format 1.0-1.2 writers logged all of `GRADIENT_STATS`; from 1.3 a writer
# logs the ones it was asked for (`gradient_stats`), these always. A pass of squares and one of
# extremes (min and max: one kernel in PyTorch) compute them all: a finite sum of squares proves
# every entry finite (no NaN, no Inf), and abs_max is the larger of -min and max.
REQUIRED_STATS = tuple(s.name for s in STATS if s.required)
# What a norms-only step holds (format 1.6; the other columns are NaN there): the norms and the
# non-finite counts that the spike, exploding, vanishing, non-finite, update-ratio and loss-spike
# rules judge at every step. The gradient norm's pass proves the counts 0 when it is finite, so
# they cost nothing on the common step; the weight and update norms are a pass over the
# weights. The dead rule judges the steps with ``zero_fraction`` (`is_logged`).
EVERY_STEP_STATS = tuple(s.name for s in STATS if s.every_step)


def every_step_stats(stats: Sequence[str]) -> Tuple[str, ...]:
    """Of a tag's ``stats``, those its writer logs at the norms-only steps too (format 1.7, the
    metadata's ``every_step_stats``): `EVERY_STEP_STATS`, the weight norm only beside the update
    norm. The update/weight ratio (the update-ratio and loss-spike rules) is the only reader of
    the weight norm that judges every step, and without the update it has nothing to divide;
    the weights are as large as the gradients, so their norm is half of a norms-only step's
    work (benchmarks/NOTES.md, "The weight norms at the full steps; writes in batches")."""
    return tuple(s for s in every_step_stats_1_6(stats)
                 if s != "weight_l2_norm" or "update_l2_norm" in stats)


def every_step_stats_1_6(stats: Sequence[str]) -> Tuple[str, ...]:
    """What a format 1.6 tag of ``stats`` held at its norms-only steps (its metadata does not
    say): every one of `EVERY_STEP_STATS` it has."""
    return tuple(s for s in stats if s in EVERY_STEP_STATS)


def logged_every_step(name: str, every_step: Sequence[str]) -> bool:
    """Whether stat ``name`` has a value at the norms-only steps too: one of ``every_step``
    (a tag's `every_step_stats`), or a ratio of two of them (update/weight)."""
    return all(n in every_step for n in DERIVED_STATS.get(name, (name,)))


# What a writer's ``stats=`` may name (`selected_stats`).
LOGGED_STATS = GRADIENT_STATS + WEIGHT_STATS + UPDATE_STATS + OPTIMIZER_STATS


def selected_stats(requested=None) -> Tuple[str, ...]:
    """The stats a writer logs, where it can, when asked for ``requested`` (the writers'
    ``stats=`` argument), in `LOGGED_STATS` order: None for all of them (the default
    everywhere), else an iterable of their names, to which `REQUIRED_STATS` are added.

    Fewer stats are less work each logged step: fewer passes over the gradients
    (``("l2_norm",)``: three instead of six, see `statistics.passes_for`), and no pass over the
    weights (``weight_l2_norm``), the updates (``update_l2_norm``) or the optimizer's state
    (``adam_rms``) unless named. The tab, the
    CLI and the alerts show what was logged; the dead-unit rule needs ``zero_fraction``, the
    update-ratio rule ``weight_l2_norm`` and ``update_l2_norm``.

    Raises:
      ValueError: a name that is not one of `LOGGED_STATS` (the message lists them), or not
        strings.
    """
    if requested is None:
        return LOGGED_STATS
    if isinstance(requested, str):
        requested = (requested,)
    known = (f"the gradient stats {list(GRADIENT_STATS)} and "
             f"{list(WEIGHT_STATS + UPDATE_STATS + OPTIMIZER_STATS)}")
    try:
        names = set(requested)
    except TypeError:
        raise ValueError(f"stats must be names among {known}, got {requested!r}") from None
    unknown = sorted(repr(n) for n in names if n not in LOGGED_STATS)
    if unknown:
        raise ValueError(f"stats: {', '.join(unknown)} not among {known}")
    return tuple(s for s in LOGGED_STATS if s in names or s in REQUIRED_STATS)


def gradient_stats(requested=None) -> Tuple[str, ...]:
    """The gradient stats of `selected_stats` (``requested``), in `GRADIENT_STATS` order."""
    return tuple(s for s in selected_stats(requested) if s in GRADIENT_STATS)


def stats_for(with_weights: bool, with_updates: bool,
              gradient: Sequence[str] = GRADIENT_STATS,
              with_optimizer: bool = False) -> Tuple[str, ...]:
    """The columns of a stats matrix, in order, for a writer that logs the ``gradient`` stats
    (`gradient_stats`), knows the variables' values (``with_weights``), sees the optimizer's
    update (``with_updates``) and reads an Adam-family optimizer's state
    (``with_optimizer``)."""
    return (
        tuple(gradient) + (WEIGHT_STATS if with_weights else ())
        + (UPDATE_STATS if with_updates else ()) + (OPTIMIZER_STATS if with_optimizer else ())
    )


def position(stats: Sequence[str], name: str) -> int:
    """The column of stat ``name`` in a matrix whose columns are ``stats`` (a tag's layout)."""
    try:
        return list(stats).index(name)
    except ValueError:
        raise KeyError(f"no stat {name!r} among {list(stats)}") from None


# Histogram of log10|g|: half-decade bins from 1e-20 to 1e10. float32 gradients below 1e-20 are
# numerically dead for any practical learning rate and land in "below"; above 1e10 is far past any
# sane gradient and lands in "above"; neither is ever dropped.
HISTOGRAM_LOG10_MIN = -20.0
HISTOGRAM_LOG10_MAX = 10.0
HISTOGRAM_BINS_PER_DECADE = 2
HISTOGRAM_LOG10_EDGES = tuple(
    float(e)
    for e in np.linspace(
        HISTOGRAM_LOG10_MIN,
        HISTOGRAM_LOG10_MAX,
        int((HISTOGRAM_LOG10_MAX - HISTOGRAM_LOG10_MIN) * HISTOGRAM_BINS_PER_DECADE) + 1,
    )
)
HISTOGRAM_LOG_BINS = len(HISTOGRAM_LOG10_EDGES) - 1
# Column layout of a histogram row.
HIST_ZERO = 0
HIST_BELOW = 1
HIST_FIRST_LOG_BIN = 2
HIST_ABOVE = HIST_FIRST_LOG_BIN + HISTOGRAM_LOG_BINS
HIST_NAN = HIST_ABOVE + 1
HIST_INF = HIST_ABOVE + 2
HISTOGRAM_BINS = HIST_INF + 1


def histogram_bin_labels():
    """Human labels of the histogram columns, in column order."""
    edges = HISTOGRAM_LOG10_EDGES
    log_bins = [f"[1e{lo:g}, 1e{hi:g})" for lo, hi in zip(edges[:-1], edges[1:])]
    return (
        ["zero", f"(0, 1e{edges[0]:g})"]
        + log_bins
        + [f">= 1e{edges[-1]:g}", "nan", "inf"]
    )
