"""What counts as vanishing, exploding, non-finite, dead or badly scaled: the one source of truth.

Pure numpy (no TensorBoard, no TensorFlow). The plugin (heatmap cell classes and alerts), users of
`read_logdir` and the ``tensorboard-gradients diagnose`` CLI all call this module, so a cell drawn
red in the browser, an alert in the panel and a failing CI gate always agree.

Inputs are `GradientSeries` (``values[step, variable, stat]`` in model order, input side first).
Entry points:

* `classify(series, thresholds)` -> ``int8[steps, variables]`` of `CLASSES` codes, one per cell
  (``missing``, ``ok``, ``vanishing``, ``exploding``, ``nonfinite``; later = worse);
* `diagnose(series, **thresholds)` -> ``list[Alert]`` sorted by severity, then first step;
* `analyze(series, thresholds)` -> both at once (the rules run once).

The rules and their sources are in `Thresholds`; every threshold can be overridden per call
(``diagnose(series, exploding_norm=100)``) and per HTTP request (``...&exploding_norm=100``).
"""

import dataclasses
import math
import warnings
from typing import Dict, List, Mapping, Optional

import numpy as np

# Cell classes, ordered from least to most alarming: merging cells keeps the largest code.
CLASSES = ("missing", "ok", "vanishing", "exploding", "nonfinite")
MISSING, OK, VANISHING, EXPLODING, NONFINITE = range(len(CLASSES))

SEVERITIES = ("critical", "warning", "info")  # sort order of alerts: most urgent first

KINDS = ("nonfinite", "exploding", "vanishing", "dead", "update_ratio")

# 1.4826 * MAD estimates the standard deviation of normally distributed data.
_MAD_TO_SIGMA = 1.4826


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The diagnosis rules' parameters. Every default, with its rationale and source.

    Norms are per-variable gradient L2 norms (``l2_norm``) unless said otherwise. "Logged steps"
    are the steps present in the log (with ``every_n_steps=10``, 5 logged steps = 50 steps).

    exploding_norm = 1e3
        Absolute ceiling for one variable's gradient norm. Gradient clipping, the standard fix for
        exploding gradients (Pascanu, Mikolov & Bengio 2013, "On the difficulty of training
        recurrent neural networks"), is usually set to a global norm of 1-10 (GPT-style training
        clips at 1.0); a single tensor 100x past the usual clip level is exploding under any of
        those settings. A single step above it is enough: an explosion is an event.
    exploding_global_norm = 1e3
        The same ceiling for the global norm ``sqrt(sum of squared variable norms)``, the quantity
        that ``clipnorm``/``global_clipnorm``/``clip_grad_norm_`` act on (Pascanu et al. 2013).
    spike_window = 25
        Spikes are judged against the median and MAD of log10(norm) over the previous complete
        block of this many logged steps (a blocked rolling median: O(steps x variables); a
        1,000-variable x 10,000-step run is classified in about 1-2 s on a 2-core CPU). Needs
        one full block of history, so the first ``spike_window`` logged steps are judged by the
        absolute ceiling only.
    spike_zscore = 5.0
        A step whose log-norm is this many robust standard deviations (1.4826 MAD) above that
        median is a spike - the robust z-score rule llm.c (z > 3 on the grad norm) and OLMo /
        Levanter (rolling sigma factors) use to catch loss spikes, "a large increase in the norm
        of the gradients" in Pascanu et al.'s words; 5 rather than 3 because it is applied to
        every variable separately, so a 3-sigma rule would fire on noise.
    spike_min_sigma = 0.2
        Floor for that sigma, in decades of norm, so a flat history does not make a 1.5x wiggle a
        spike: with the defaults a spike is always at least 10**(5 * 0.2) = 10x the running median
        (one order of magnitude in one step is never healthy), and in a noisy history (sigma 0.3
        decades) it takes 30x. Without the floor, a 25-step MAD estimate makes 3x jumps of pure
        log-normal noise fire every ~40,000 cells.
    vanishing_norm = 1e-7
        Absolute floor for one variable's gradient norm. Below it EVERY entry is below 1e-7, which
        is Keras Adam's ``epsilon`` (PyTorch: 1e-8): Adam's step ``g / (sqrt(v) + eps)`` shrinks
        toward zero there, and a plain SGD step ``lr * g`` on weights of order 1 is below float32's
        relative resolution (6e-8) for any learning rate <= 1, i.e. rounded away.
    depth_ratio = 1e-4
        Depth profile (Glorot & Bengio 2010, "Understanding the difficulty of training deep
        feedforward neural networks": back-propagated gradients shrink toward the input with a
        poor activation/initialisation): a LAYER whose gradient norm (all its variables together)
        is below this fraction of the output-side layers' norm at the same step is vanishing. Four
        orders of magnitude: healthy networks, including ones with normalisation layers and
        residual branches, keep layers within one or two orders of each other; the demo's
        12-layer sigmoid network drops below 1e-4 at its input side. Judged per layer, not per
        variable, so a legitimately tiny variable (a final bias next to its kernel) is not flagged.
    depth_reference_fraction = 0.25
        The output-side reference: the median norm of the last quarter of the layers (at least
        one layer), so one odd output layer does not set the scale. Output-side layers above
        ``exploding_norm`` do not count: an exploding output side would otherwise make every
        healthy layer below it look vanishing.
    sustain_steps = 5
        Vanishing and dead gradients must hold for this many consecutive logged steps: one noisy
        step is not an alert (and not a highlighted cell).
    dead_fraction = 0.99
        A variable whose gradient is exactly zero in at least this fraction of its entries for
        ``sustain_steps`` logged steps is dead: dead ReLUs (CS231n notes: as much as 40% of a
        network can die at too high a learning rate; here 99% of the gradient is gone) or a
        disconnected path. Embedding tables are expected to be mostly zero (only the looked-up
        rows get a gradient); raise this threshold or ignore those alerts for them.
    update_ratio_low = 1e-5, update_ratio_high = 1e-1
        The update/weight ratio ``||w_new - w_old|| / ||w||`` of a healthy layer is around 1e-3
        (CS231n notes, "Neural Networks Part 3"; Karpathy's makemore part 3 plots its log10 per
        layer). Two decades either side is "far outside": a variable whose median ratio over the
        run lies outside [1e-5, 1e-1] is barely learning or being rewritten every step.
        Judged for kernels only (variables of 2+ dimensions), as Karpathy's plot does: biases
        and normalisation scales start at 0 or 1, so their early ratios are large by
        construction and say nothing about the learning rate.
        Needs ``update_l2_norm`` and ``weight_l2_norm`` (the Keras monitor logs both). When only
        weights are known, the gradient/weight ratio is judged against this band divided by
        ``reference_learning_rate`` - the update an SGD step would make.
    reference_learning_rate = 1e-2
        The SGD learning rate assumed for that gradient/weight fallback (Keras SGD's default).
    """

    exploding_norm: float = 1e3
    exploding_global_norm: float = 1e3
    spike_window: int = 25
    spike_zscore: float = 5.0
    spike_min_sigma: float = 0.2
    vanishing_norm: float = 1e-7
    depth_ratio: float = 1e-4
    depth_reference_fraction: float = 0.25
    sustain_steps: int = 5
    dead_fraction: float = 0.99
    update_ratio_low: float = 1e-5
    update_ratio_high: float = 1e-1
    reference_learning_rate: float = 1e-2

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is int or field.type == "int":
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise ValueError(f"threshold {field.name} must be an integer, got {value!r}")
                if not 1 <= value <= 10**6:
                    raise ValueError(f"threshold {field.name} must be in [1, 1000000], got {value}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                    raise ValueError(f"threshold {field.name} must be a number, got {value!r}")
                if not math.isfinite(value) or value <= 0:
                    raise ValueError(
                        f"threshold {field.name} must be a finite positive number, got {value}"
                    )
        if self.depth_reference_fraction > 1:
            raise ValueError("threshold depth_reference_fraction must be at most 1")
        if self.dead_fraction > 1:
            raise ValueError("threshold dead_fraction must be at most 1")
        if self.update_ratio_low >= self.update_ratio_high:
            raise ValueError("threshold update_ratio_low must be below update_ratio_high")

    @classmethod
    def names(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_strings(cls, overrides: Mapping[str, str]) -> "Thresholds":
        """Thresholds from text (HTTP query parameters, CLI flags); `ValueError` on bad input."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        parsed = {}
        for name, text in overrides.items():
            if name not in types:
                raise ValueError(
                    f"unknown threshold {name!r}; known thresholds: {', '.join(types)}"
                )
            try:
                parsed[name] = int(text) if types[name] in (int, "int") else float(text)
            except (TypeError, ValueError):
                raise ValueError(f"threshold {name} must be a number, got {text!r}") from None
        return cls(**parsed)


@dataclasses.dataclass(frozen=True)
class Alert:
    """One finding. ``variable``/``layer`` are None for whole-model findings (the global norm)."""

    kind: str  # one of KINDS
    rule: str  # which rule of the kind fired: e.g. "absolute", "spike", "global", "depth"
    variable: Optional[str]
    layer: Optional[str]
    first_step: int
    last_step: int
    steps: int  # how many logged steps met the rule
    value: float  # the worst measured value (see `message` for its unit)
    threshold: float
    severity: str  # one of SEVERITIES
    message: str

    def to_json(self) -> Dict:
        return dataclasses.asdict(self)


def _stat(series, name):
    """``[steps, variables]`` of a stat as logged (a view: only compared, never written)."""
    return series.stat(name)


def _log10(values):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.asarray(values, dtype=np.float32))


def _all_in_window(flags: np.ndarray, length: int) -> np.ndarray:
    """``out[t] = all(flags[t : t + length])`` along axis 0 (``length - 1`` shorter than flags).

    Doubling the covered span each pass: O(log length) boolean passes, no integer cumsums.
    """
    result, span = flags, 1
    while span < length:
        shift = min(span, length - span)
        result = result[:-shift] & result[shift:]
        span += shift
    return result


def _sustained(flags: np.ndarray, length: int) -> np.ndarray:
    """True where a cell lies in a run of at least ``length`` consecutive True along axis 0."""
    steps = flags.shape[0]
    if length <= 1:
        return flags.copy()
    if steps < length:
        return np.zeros_like(flags)
    run_starts = _all_in_window(flags, length)
    padding = np.zeros((length - 1,) + flags.shape[1:], dtype=bool)
    # Cell t is covered when a full run starts in [t - length + 1, t].
    return ~_all_in_window(~np.concatenate([padding, run_starts, padding]), length)


def _nanmedian(values: np.ndarray) -> np.ndarray:
    """Median over the last axis ignoring NaN (NaN where all are NaN).

    Sorting short rows is several times faster than `np.nanmedian` on these shapes.
    """
    ordered = np.sort(values, axis=-1)  # NaN sorts last
    count = np.sum(~np.isnan(ordered), axis=-1)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[..., None], -1)[..., 0]
    high = np.take_along_axis(ordered, np.minimum(count // 2, ordered.shape[-1] - 1)[..., None], -1)
    return np.where(count > 0, (low + high[..., 0]) / 2, np.nan)


def _forward_filled(blocks: np.ndarray) -> np.ndarray:
    """Each NaN entry along axis 0 replaced by the last non-NaN entry before it (NaN if none)."""
    positions = np.arange(len(blocks)).reshape((-1,) + (1,) * (blocks.ndim - 1))
    index = np.where(np.isnan(blocks), -1, positions)
    last = np.maximum.accumulate(index, axis=0)
    filled = np.take_along_axis(blocks, np.maximum(last, 0), axis=0)
    return np.where(last >= 0, filled, np.nan)


def _spike_zscores(log_norms: np.ndarray, thresholds: Thresholds, exclude=None):
    """(robust z-score, log10 ratio) of each cell against the running median and MAD.

    The reference of step t is the latest complete block of ``spike_window`` logged steps before
    t's block that had healthy cells: ``exclude``d cells (vanishing ones) and missing ones do not
    count, so a layer recovering from a vanishing stretch is compared with its level before it,
    not flagged as a spike. NaN where there is no reference yet. float32: log-norms need no more.
    """
    window = thresholds.spike_window
    steps = log_norms.shape[0]
    blocks = steps // window
    if steps <= window:
        nothing = np.full(log_norms.shape, np.nan, dtype=np.float32)
        return nothing, nothing
    usable = np.isfinite(log_norms)
    if exclude is not None:
        usable &= ~exclude
    healthy = np.where(usable[: blocks * window], log_norms[: blocks * window], np.float32(np.nan))
    # [blocks, variables, window]: each block's window contiguous for the sort.
    blocked = np.ascontiguousarray(
        healthy.reshape((blocks, window) + log_norms.shape[1:]).swapaxes(1, -1)
    )
    median = _nanmedian(blocked)
    mad = _nanmedian(np.abs(blocked - median[..., None]))
    median, mad = _forward_filled(median), _forward_filled(np.where(np.isnan(median), np.nan, mad))
    sigma = np.maximum(np.float32(_MAD_TO_SIGMA) * mad, np.float32(thresholds.spike_min_sigma))
    # Step t (t >= window) is judged against block t // window - 1 (or the last healthy one).
    reference = np.arange(window, steps) // window - 1
    excess = np.empty(log_norms.shape, dtype=np.float32)
    excess[:window] = np.nan
    with np.errstate(invalid="ignore"):
        np.subtract(log_norms[window:], median[reference], out=excess[window:])
        z = excess / np.concatenate([sigma[:1].repeat(window, axis=0), sigma[reference]])
    return z, excess


def _spikes(z: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return z >= thresholds.spike_zscore


def _layer_index(series):
    """(layer names in model order, row -> layer position)."""
    names: List[str] = []
    positions = {}
    rows = []
    for layer in series.layers:
        if layer not in positions:
            positions[layer] = len(names)
            names.append(layer)
        rows.append(positions[layer])
    return names, np.array(rows, dtype=np.int64)


def _layer_norms(norms: np.ndarray, rows: np.ndarray, layer_count: int) -> np.ndarray:
    """``[steps, layers]`` norm of each layer's variables together (NaN when all are missing)."""
    order = np.argsort(rows, kind="stable")
    if (np.diff(rows) < 0).any():  # layers interleaved (shared or reused layers): group them
        norms, rows = norms[:, order], rows[order]
    boundaries = np.searchsorted(rows, np.arange(layer_count))
    valid = ~np.isnan(norms)
    with np.errstate(over="ignore"):
        squares = np.add.reduceat(np.where(valid, norms, 0.0) ** 2, boundaries, axis=1)
    present = np.logical_or.reduceat(valid, boundaries, axis=1)
    return np.where(present, np.sqrt(squares), np.nan)


def _depth_ratios(series, norms: np.ndarray, thresholds: Thresholds):
    """(layer names, ``[steps, layers]`` layer norm / output-side reference norm) or None."""
    names, rows = _layer_index(series)
    if len(names) < 2:
        return None
    layer_norms = _layer_norms(norms, rows, len(names))
    reference_count = max(1, int(math.ceil(len(names) * thresholds.depth_reference_fraction)))
    output_side = layer_norms[:, -reference_count:]
    with np.errstate(invalid="ignore"):
        healthy = np.where(output_side >= thresholds.exploding_norm, np.nan, output_side)
    reference = _nanmedian(healthy)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = layer_norms / reference[:, None]
    return names, rows, ratios


@dataclasses.dataclass
class _Findings:
    """Per-cell rule results shared by `classify` and `diagnose` (computed once)."""

    norms: np.ndarray
    missing: np.ndarray
    nonfinite: np.ndarray
    exploding_absolute: np.ndarray
    spike_z: np.ndarray  # robust z-score against the running median (NaN: no history)
    spike_excess: np.ndarray  # log10(norm / running median)
    spike: np.ndarray
    vanishing_absolute: np.ndarray  # sustained
    depth: Optional[tuple]  # (layer names, row -> layer, [steps, layers] ratios, sustained flags)
    vanishing: np.ndarray  # either vanishing rule, per cell


def _findings(series, thresholds: Thresholds) -> _Findings:
    norms = np.asarray(_stat(series, "l2_norm"), dtype=np.float64)
    missing = np.isnan(_stat(series, "size"))
    with np.errstate(invalid="ignore"):
        nonfinite = ~missing & ((_stat(series, "nan_count") > 0) | (_stat(series, "inf_count") > 0))
        exploding_absolute = ~missing & (norms >= thresholds.exploding_norm)
    # The norm of a gradient with NaN/Inf entries covers only its finite entries (0 when none is):
    # it says nothing about vanishing or spiking, so those rules see no value there.
    finite_norms = np.where(nonfinite, np.nan, norms)
    with np.errstate(invalid="ignore"):
        vanishing_absolute = _sustained(finite_norms < thresholds.vanishing_norm,
                                        thresholds.sustain_steps)
    vanishing = vanishing_absolute.copy()
    depth = _depth_ratios(series, finite_norms, thresholds)
    if depth is not None:
        names, rows, ratios = depth
        with np.errstate(invalid="ignore"):
            flags = _sustained(ratios < thresholds.depth_ratio, thresholds.sustain_steps)
        depth = (names, rows, ratios, flags)
        vanishing |= flags[:, rows] & ~missing
    spike_z, spike_excess = _spike_zscores(_log10(finite_norms), thresholds, exclude=vanishing)
    spike = ~missing & _spikes(spike_z, thresholds)
    return _Findings(
        norms, missing, nonfinite, exploding_absolute, spike_z, spike_excess, spike,
        vanishing_absolute, depth, vanishing,
    )


def _classes(findings: _Findings) -> np.ndarray:
    classes = np.full(findings.norms.shape, OK, dtype=np.int8)
    classes[findings.vanishing] = VANISHING
    classes[findings.exploding_absolute | findings.spike] = EXPLODING
    classes[findings.nonfinite] = NONFINITE
    classes[findings.missing] = MISSING
    return classes


def classify(series, thresholds: Optional[Thresholds] = None) -> np.ndarray:
    """``int8[steps, variables]``: the `CLASSES` code of every logged cell.

    ``nonfinite`` (any NaN/Inf entry) > ``exploding`` (norm above ``exploding_norm``, or a spike
    against the running median) > ``vanishing`` (norm below ``vanishing_norm``, or the variable's
    layer ``depth_ratio`` below the output side, for ``sustain_steps``) > ``ok``; ``missing`` =
    no gradient at that step. See `Thresholds` for the rules' sources.
    """
    return _classes(_findings(series, thresholds or Thresholds()))


class _AlertBuilder:
    def __init__(self, series):
        self.series = series
        self.steps = np.asarray(series.steps)
        self.alerts: List[Alert] = []

    def add(self, kind, rule, severity, mask, values, worst, threshold, describe, row=None,
            layer=None):
        """One alert for the steps where ``mask`` (1-D over steps) holds, if any.

        ``row`` names a variable (its layer comes along); ``layer`` alone a whole layer; neither
        the whole model.
        """
        hits = np.flatnonzero(mask)
        if hits.size == 0:
            return
        picked = values[hits]
        finite = picked[~np.isnan(picked)]
        value = float(worst(finite)) if finite.size else float("nan")
        variable = None if row is None else self.series.variables[row]
        if row is not None:
            layer = self.series.layers[row]
        first, last = int(self.steps[hits[0]]), int(self.steps[hits[-1]])
        if first == last:
            span = f"at step {first}"
        else:
            span = f"at {hits.size} logged steps from step {first} to {last}"
        subject = variable or (f"layer {layer}" if layer else "whole model")
        self.alerts.append(
            Alert(
                kind=kind,
                rule=rule,
                variable=variable,
                layer=layer,
                first_step=first,
                last_step=last,
                steps=int(hits.size),
                value=value,
                threshold=float(threshold),
                severity=severity,
                message=f"{subject}: {describe(value)} {span}.",
            )
        )


def diagnose(series, thresholds: Optional[Thresholds] = None, **overrides) -> List[Alert]:
    """Every finding in one logged series, most urgent first.

    Args:
      series: a `GradientSeries` (from `read_logdir`, or the plugin's data provider).
      thresholds: a `Thresholds` to start from (default: the documented defaults).
      **overrides: `Thresholds` fields to change, e.g. ``diagnose(series, exploding_norm=100)``.

    Returns:
      `Alert` objects sorted by severity (critical, warning, info), then first step, then model
      order. Kinds: ``nonfinite`` (critical; every variable with NaN/Inf, and the message of those
      hit at the run's first non-finite step says so), ``exploding`` (absolute and global norm:
      critical; spikes: warning), ``vanishing`` (absolute floor per variable, depth profile per
      layer: warning), ``dead`` (warning), ``update_ratio`` (info).

    Raises:
      ValueError: an unknown or invalid threshold.
    """
    limits = _limits(thresholds, overrides)
    return _alerts(series, _findings(series, limits), limits)


@dataclasses.dataclass(frozen=True)
class Analysis:
    """`classify` and `diagnose` of one series, computed together (the rules run once)."""

    classes: np.ndarray
    alerts: List[Alert]


def analyze(series, thresholds: Optional[Thresholds] = None, **overrides) -> Analysis:
    """Cell classes and alerts at once: what the plugin serves for the heatmap and the panel."""
    limits = _limits(thresholds, overrides)
    findings = _findings(series, limits)
    return Analysis(_classes(findings), _alerts(series, findings, limits))


def _limits(thresholds, overrides) -> Thresholds:
    try:
        return dataclasses.replace(thresholds or Thresholds(), **overrides)
    except TypeError as error:  # an unknown field name
        raise ValueError(f"{error}; known thresholds: {', '.join(Thresholds.names())}") from None


def _flagged(mask: np.ndarray) -> np.ndarray:
    """Columns (variables or layers) with at least one flagged step."""
    return np.flatnonzero(mask.any(axis=0))


def _alerts(series, findings: _Findings, limits: Thresholds) -> List[Alert]:
    builder = _AlertBuilder(series)
    norms = findings.norms

    first_nonfinite_row = np.flatnonzero(findings.nonfinite.any(axis=1))
    first_nonfinite = first_nonfinite_row[0] if first_nonfinite_row.size else None
    nonfinite_entries = _stat(series, "nan_count") + _stat(series, "inf_count")
    for row in _flagged(findings.nonfinite):
        mask = findings.nonfinite[:, row]
        at_first = first_nonfinite is not None and mask[first_nonfinite]
        builder.add(
            "nonfinite", "count", "critical", mask, nonfinite_entries[:, row], np.max, 0,
            lambda v, at_first=at_first: f"gradient had up to {v:.0f} NaN/Inf entries"
            + (" (among the first non-finite gradients of the run)" if at_first else ""),
            row=row,
        )

    for row in _flagged(findings.exploding_absolute):
        builder.add(
            "exploding", "absolute", "critical", findings.exploding_absolute[:, row],
            norms[:, row], np.max, limits.exploding_norm,
            lambda v: f"gradient norm reached {v:.3g}, above {limits.exploding_norm:g}",
            row=row,
        )
    for row in _flagged(findings.spike):
        _add_spike(builder, findings.spike[:, row], findings.spike_z[:, row],
                   findings.spike_excess[:, row], limits, "gradient norm", row=row)

    with np.errstate(over="ignore", invalid="ignore"):
        global_norm = np.sqrt(np.nansum(norms**2, axis=1))
    global_present = ~findings.missing.all(axis=1) & ~findings.nonfinite.any(axis=1)
    with np.errstate(invalid="ignore"):
        global_exploding = global_present & (global_norm >= limits.exploding_global_norm)
    builder.add(
        "exploding", "global", "critical", global_exploding, global_norm, np.max,
        limits.exploding_global_norm,
        lambda v: f"global gradient norm reached {v:.3g}, above {limits.exploding_global_norm:g}",
    )
    global_z, global_excess = _spike_zscores(
        _log10(np.where(global_present, global_norm, np.nan))[:, None], limits
    )
    _add_spike(builder, global_present & _spikes(global_z[:, 0], limits), global_z[:, 0],
               global_excess[:, 0], limits, "global gradient norm", rule="global_spike")

    for row in _flagged(findings.vanishing_absolute):
        builder.add(
            "vanishing", "absolute", "warning", findings.vanishing_absolute[:, row],
            norms[:, row], np.min, limits.vanishing_norm,
            lambda v: f"gradient norm stayed below {limits.vanishing_norm:g} (down to {v:.3g})",
            row=row,
        )
    if findings.depth is not None:
        names, _, ratios, flags = findings.depth
        for position in _flagged(flags):
            builder.add(
                "vanishing", "depth", "warning", flags[:, position], ratios[:, position], np.min,
                limits.depth_ratio,
                lambda v: f"gradient norm fell to {v:.3g}x that of the output-side layers "
                f"(below {limits.depth_ratio:g})",
                layer=names[position],
            )

    zero_fraction = _stat(series, "zero_fraction")
    with np.errstate(invalid="ignore"):
        dead = _sustained((zero_fraction >= limits.dead_fraction) & ~findings.nonfinite,
                          limits.sustain_steps)
    for row in _flagged(dead):
        builder.add(
            "dead", "zero_fraction", "warning", dead[:, row], zero_fraction[:, row], np.max,
            limits.dead_fraction,
            lambda v: f"{v:.1%} of the gradient entries were exactly zero (dead units or a "
            "disconnected path; expected for embedding tables)",
            row=row,
        )

    _update_ratio_alerts(series, limits, builder, findings.nonfinite)

    severity_rank = {s: i for i, s in enumerate(SEVERITIES)}
    order = {name: i for i, name in enumerate(series.variables)}
    layer_order = {name: i for i, name in enumerate(series.layers)}
    return sorted(
        builder.alerts,
        key=lambda a: (
            severity_rank[a.severity],
            a.first_step,
            order.get(a.variable, layer_order.get(a.layer, -1)),
        ),
    )


def _add_spike(builder, mask, z, excess, limits, what, rule="spike", row=None):
    ratio = float(np.nanmax(10.0 ** excess[mask])) if mask.any() else float("nan")
    builder.add(
        "exploding", rule, "warning", mask, z, np.max, limits.spike_zscore,
        lambda v: f"{what} spiked to {ratio:.3g}x its running median (robust z-score {v:.3g}, "
        f"threshold {limits.spike_zscore:g})",
        row=row,
    )


def _update_ratio_alerts(series, limits, builder, nonfinite):
    available = series.available_stats
    if "update_weight_ratio" in available:
        ratios, rule, scale = series.stat("update_weight_ratio"), "update/weight", 1.0
    elif "grad_weight_ratio" in available:
        ratios, rule = series.stat("grad_weight_ratio"), "gradient/weight"
        scale = 1.0 / limits.reference_learning_rate
    else:
        return
    ratios = np.where(nonfinite, np.nan, ratios)  # a NaN/Inf step's ratio describes no update
    what = f"{rule} ratio"
    low, high = limits.update_ratio_low * scale, limits.update_ratio_high * scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        medians = np.nanmedian(ratios, axis=0)
    for row, median in enumerate(medians):
        shape = series.shapes[row]
        if shape is None or len(shape) < 2 or not np.isfinite(median) or low <= median <= high:
            continue
        too_low = median < low
        with np.errstate(invalid="ignore"):
            mask = ratios[:, row] < low if too_low else ratios[:, row] > high
        builder.add(
            "update_ratio", rule, "info", mask, ratios[:, row], lambda _: median,
            low if too_low else high,
            lambda v, too_low=too_low: f"median {what} {v:.3g} is "
            + (f"below {low:g} (barely learning)" if too_low else f"above {high:g} (weights "
               "rewritten every step)"),
            row=row,
        )
