"""Rows by layer: each layer's variables combined as if its gradients were one tensor.

The tab's Layers view draws one row per layer (the layer-by-step heatmap without kernel/bias
striping), and the vanishing rule judges layers. A layer's statistic at a step combines its
variables' values by the kind of combination its row in the format's table of statistics names
(`columns.Stat.layer_combination`; the series says it: `GradientSeries.layer_combination`):
L2 norms as the root of summed squares, counts summed, maxima the largest, means weighted by
entries, standard deviations pooled (with the means: a std logged without the mean has no value
by layer); a derived ratio is the ratio of its combined inputs. Only the statistics logged are
combined: a writer may log a subset of them. Variables without a gradient at that step are left
out; a layer none of whose variables has one is missing there. Its cell class is the worst of
its variables'. Pure numpy.
"""

import dataclasses
from typing import List, Tuple

import numpy as np


# How a layer combines its variables' values of a statistic at one step, exactly as if the
# layer's gradients were one tensor (`combined` has the maths of each).
ROOT_SUM_SQUARES, SUM, LARGEST, SMALLEST = "root_sum_squares", "sum", "largest", "smallest"
FINITE_WEIGHTED, SIZE_WEIGHTED, POOLED_STD = "finite_weighted", "size_weighted", "pooled_std"
# A root mean square over the entries: the root of the entry-weighted mean of the squares.
ROOT_MEAN_SQUARES = "root_mean_squares"
# A derived ratio's: never logged, it is the ratio of its combined inputs (`series.stat`).
RATIO = "ratio"
KINDS = (ROOT_SUM_SQUARES, SUM, LARGEST, SMALLEST, FINITE_WEIGHTED, SIZE_WEIGHTED, POOLED_STD,
         ROOT_MEAN_SQUARES, RATIO)


@dataclasses.dataclass(frozen=True)
class Layers:
    """The layers of a series' variables, in model order (a layer's first variable decides)."""

    names: List[str]
    rows: np.ndarray  # variable row -> position in ``names``

    @classmethod
    def of(cls, layer_of_rows) -> "Layers":
        names: List[str] = []
        positions = {}
        rows = []
        for layer in layer_of_rows:
            if layer not in positions:
                positions[layer] = len(names)
                names.append(layer)
            rows.append(positions[layer])
        return cls(names, np.array(rows, dtype=np.int64))

    def _grouped(self, array: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(``array`` with its variable axis (1) in layer order, each layer's first column)."""
        if (np.diff(self.rows) < 0).any():  # layers interleaved (shared or reused layers)
            array = array[:, np.argsort(self.rows, kind="stable")]
        starts = np.searchsorted(np.sort(self.rows), np.arange(len(self.names)))
        return array, starts

    def reduce(self, ufunc, array: np.ndarray) -> np.ndarray:
        """``ufunc.reduceat`` over each layer's variables: ``[steps, variables, ...]`` ->
        ``[steps, layers, ...]``."""
        grouped, starts = self._grouped(array)
        return ufunc.reduceat(grouped, starts, axis=1)

    def root_sum_squares(self, norms: np.ndarray) -> np.ndarray:
        """``[steps, layers]`` L2 norm of each layer's variables together (NaN norms left
        out; NaN when all are)."""
        valid = ~np.isnan(norms)
        with np.errstate(over="ignore"):
            squares = self.reduce(np.add, np.where(valid, norms, 0.0) ** 2)
        return np.where(self.reduce(np.logical_or, valid), np.sqrt(squares), np.nan)

    def worst_classes(self, classes: np.ndarray) -> np.ndarray:
        """``int8[steps, layers]``: each layer's worst `analysis.CLASSES` code."""
        return self.reduce(np.maximum, classes)


def needed_stats(stat: str, like) -> Tuple[str, ...]:
    """The logged statistics of series ``like``, in its order, that `combined` needs to give a
    layer's ``stat``: the stat (a ratio: its inputs), the entry counts that weigh means, and
    the mean that pools standard deviations."""
    inputs = like.inputs_of(stat)
    needed = {*inputs, "size", "nan_count", "inf_count"}
    if any(like.layer_combination(name) == POOLED_STD for name in inputs):
        needed.add("mean")
    return tuple(name for name in like.stat_names if name in needed)


def combined(series):
    """``series`` with one row per layer (variables and layers both the layer names, shapes
    ``(entries,)``, no histograms), each logged statistic combined by its kind
    (``series.layer_combination(name)``; derived ratios follow from the combined inputs)."""
    layers = Layers.of(series.layers)
    values = np.asarray(series.values, dtype=np.float64)
    stat = {name: values[:, :, i] for i, name in enumerate(series.stat_names)}
    present = ~np.isnan(stat["size"])
    finite_entries = np.where(present, stat["size"] - stat["nan_count"] - stat["inf_count"], 0.0)
    sizes = np.where(present, stat["size"], 0.0)
    combined_values = np.empty(values.shape[:1] + (len(layers.names), values.shape[2]))

    def weighted_mean(x, weights):
        weights = np.where(np.isnan(x), 0.0, weights)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (layers.reduce(np.add, np.where(weights > 0, x * weights, 0.0))
                    / layers.reduce(np.add, weights))

    for position, name in enumerate(series.stat_names):
        kind, x = series.layer_combination(name), np.where(present, stat[name], np.nan)
        if kind == ROOT_SUM_SQUARES:
            result = layers.root_sum_squares(x)
        elif kind == SUM:
            result = layers.reduce(np.add, np.where(present, x, 0.0))
        elif kind == LARGEST:
            result = layers.reduce(np.fmax, x)
        elif kind == SMALLEST:
            result = layers.reduce(np.fmin, x)
        elif kind == FINITE_WEIGHTED:
            result = weighted_mean(x, finite_entries)
        elif kind == SIZE_WEIGHTED:
            result = weighted_mean(x, sizes)
        elif kind == ROOT_MEAN_SQUARES:
            result = np.sqrt(weighted_mean(x**2, sizes))
        elif kind == POOLED_STD and "mean" in stat:
            # Within-variable variance plus each variable's mean's distance from the layer's:
            # a sum of non-negative terms, so nothing cancels when |mean| >> std.
            mean = np.where(present, stat["mean"], np.nan)
            layer_mean = weighted_mean(mean, finite_entries)
            spread = x**2 + (mean - layer_mean[:, layers.rows]) ** 2
            result = np.sqrt(weighted_mean(spread, finite_entries))
        else:  # a newer writer's statistic this version cannot combine, or a std logged
            # without the mean that pools it (`columns.gradient_stats`): no value by layer
            result = np.full(combined_values.shape[:2], np.nan)
        combined_values[:, :, position] = result
    layer_present = layers.reduce(np.logical_or, present)
    combined_values[~layer_present] = np.nan
    entries = {}
    for layer, shape in zip(series.layers, series.shapes):
        known = entries.get(layer, 0)
        entries[layer] = None if shape is None or known is None else known + int(np.prod(shape))
    return dataclasses.replace(
        series, variables=tuple(layers.names), layers=tuple(layers.names),
        shapes=tuple(None if entries[name] is None else (entries[name],) for name in layers.names),
        values=combined_values.astype(series.values.dtype, copy=False), histograms=None)
