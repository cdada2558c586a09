"""The on-disk contract of the `gradients` plugin: one place defines it.

Every logged step of every monitored model is ONE summary value:

* plugin name ``gradients``, ``data_class=DATA_CLASS_TENSOR`` (without it neither TensorBoard
  loader serves the tensor);
* tag = the summary name (default ``gradients``);
* tensor = a float matrix ``[variables, stats]``: row ``i`` is ``variables[i]``, column ``j`` is
  ``stats[j]`` of the metadata below. float32, or float64 when any input gradient was float64
  (so a float64 gradient of 1e300 is not stored as Inf).

A missing gradient (``None``: the variable did not take part in the loss) is a row whose every
entry is NaN. A real gradient always has a finite ``size``, so ``isnan(size)`` tells "missing"
apart from "contains NaN" (which is ``nan_count > 0``).

The optional distribution is a second summary under tag ``<name>_histograms`` (its own metadata,
``kind = "histograms"``): a matrix ``[variables, HISTOGRAM_BINS]`` of counts of ``|g|`` on fixed
log10 edges shared by all variables, steps and runs, with explicit bins for exact zeros, values
below/above the edges, NaN and +-Inf (see ``histogram_bin_labels``).

Training monitors (the Keras `GradientMonitor`) also mark where epochs start: tag
``<name>_epochs`` (``kind = "epochs"``), one scalar per epoch = the epoch index (0-based, as Keras
counts), logged at the step that starts the epoch. Readers take the epochs of a name for every tag
of that name.

Metadata ``content`` is small UTF-8 JSON::

    {"format_version": [1, 1], "kind": "stats" | "histograms" | "epochs", "name": "gradients",
     "variables": [...], "layers": [...], "shapes": [[...], ...],
     "stats": [...]                      # kind == "stats"
     "log10_edges": [...], "bins": [...] # kind == "histograms"
    }                                    # kind == "epochs": no variables/layers/shapes

History: 1.0 stats + histograms; 1.1 adds the ``epochs`` kind and the ``update_l2_norm`` stat.

Version policy: the minor version grows when fields are added that old readers may ignore; the
major version grows when old readers would misread the data, and readers refuse a newer major
version with ``UnsupportedFormatError`` instead of guessing.

Both TensorBoard loaders keep only the FIRST metadata seen for a tag, so the variable layout of a
tag never changes: when a writer sees a different variable set (or stat set) under a name it has
already used, it writes to ``<name>_varset<k>`` (k = 2, 3, ...) instead; see `LayoutTags`.
"""

import dataclasses
import json
import re
from typing import Optional, Sequence, Tuple

import numpy as np

PLUGIN_NAME = "gradients"
FORMAT_VERSION = (1, 1)

KIND_STATS = "stats"
KIND_HISTOGRAMS = "histograms"
KIND_EPOCHS = "epochs"

DEFAULT_NAME = "gradients"
HISTOGRAM_TAG_SUFFIX = "_histograms"
EPOCHS_TAG_SUFFIX = "_epochs"
VARSET_TAG_INFIX = "_varset"

# Column order of the stats matrix. Finite statistics are over the finite entries only; the
# counts say how many entries were NaN / +-Inf; `size` counts every entry of the dense gradient.
GRADIENT_STATS = (
    "l2_norm",
    "mean",
    "std",
    "min",
    "max",
    "abs_max",
    "mean_abs",
    "zero_fraction",
    "nan_count",
    "inf_count",
    "size",
)
# Appended when the variables' values are known (enables gradient/weight ratios).
WEIGHT_STATS = ("weight_l2_norm",)
# Appended when the writer sees the optimizer's update: ||w_after - w_before|| of the step (the
# update/weight ratio ``update_l2_norm / weight_l2_norm``, with ``weight_l2_norm`` taken before
# the update).
UPDATE_STATS = ("update_l2_norm",)

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


class UnsupportedFormatError(ValueError):
    """Raised for data written in a format this version cannot read correctly."""


_TF_OUTPUT_SUFFIX = re.compile(r":\d+$")


def clean_variable_name(name: str) -> str:
    """Drops TF1-style output suffixes (``dense/kernel:0`` -> ``dense/kernel``)."""
    return _TF_OUTPUT_SUFFIX.sub("", name)


def layer_of(variable_name: str) -> str:
    """The layer that owns a variable, derived from its path.

    ``dense_3/kernel`` -> ``dense_3`` (Keras 3 ``var.path``, TF names, JAX tree paths),
    ``layer1.0.conv1.weight`` -> ``layer1.0.conv1`` (PyTorch ``named_parameters``); a name with
    neither separator is its own layer.
    """
    name = clean_variable_name(variable_name)
    for separator in ("/", "."):
        if separator in name:
            return name.rsplit(separator, 1)[0]
    return name


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the rows and columns of one tag's matrices mean. Fixed for the life of a tag."""

    variables: Tuple[str, ...]
    layers: Tuple[str, ...]
    shapes: Tuple[Optional[Tuple[int, ...]], ...]  # None: unknown (a missing gradient)
    stats: Tuple[str, ...]

    @classmethod
    def create(
        cls, variables: Sequence[str], shapes, with_weights: bool, with_updates: bool = False
    ) -> "Layout":
        names = unique_names([clean_variable_name(v) for v in variables])
        return cls(
            variables=tuple(names),
            layers=tuple(layer_of(v) for v in names),
            shapes=tuple(None if s is None else tuple(int(d) for d in s) for s in shapes),
            stats=GRADIENT_STATS
            + (WEIGHT_STATS if with_weights else ())
            + (UPDATE_STATS if with_updates else ()),
        )


def unique_names(names: Sequence[str]):
    """Makes names unique by suffixing repeats with ``_1``, ``_2``, ... (rows must be tellable)."""
    originals = set(names)
    used = set()
    result = []
    for name in names:
        candidate, suffix = name, 0
        while candidate in used or (candidate != name and candidate in originals):
            suffix += 1
            candidate = f"{name}_{suffix}"
        used.add(candidate)
        result.append(candidate)
    return result


@dataclasses.dataclass(frozen=True)
class PluginData:
    """The parsed metadata content of one tag."""

    kind: str
    name: str
    layout: Optional[Layout]  # None for kind "epochs"
    format_version: Tuple[int, int]
    log10_edges: Optional[Tuple[float, ...]] = None
    bins: Optional[Tuple[str, ...]] = None


class LayoutTags:
    """Chooses the tag for each layout under a summary name, per writer.

    The first layout seen under ``name`` gets tag ``name``; each different later layout gets
    ``name_varset2``, ``name_varset3``, ... so no tag ever mixes two layouts.
    """

    def __init__(self):
        self._tags = {}

    def tag_for(self, name: str, layout: Layout) -> str:
        layouts = self._tags.setdefault(name, {})
        if layout not in layouts:
            index = len(layouts) + 1
            layouts[layout] = name if index == 1 else f"{name}{VARSET_TAG_INFIX}{index}"
        return layouts[layout]


class MissingGradientWarnings:
    """Warns once per variable that had no gradient (logged as a missing row, not as zeros)."""

    def __init__(self, logger):
        self._logger = logger
        self._warned = set()

    def warn(self, names):
        new = [n for n in names if n not in self._warned]
        if new:
            self._warned.update(new)
            self._logger.warning(
                "No gradient for %d variable(s) (logged as missing, not as zeros): %s",
                len(new),
                ", ".join(new[:10]) + (" ..." if len(new) > 10 else ""),
            )


def histogram_tag(stats_tag: str) -> str:
    return stats_tag + HISTOGRAM_TAG_SUFFIX


def epochs_tag(name: str) -> str:
    return name + EPOCHS_TAG_SUFFIX


def _content(kind: str, name: str, layout: Optional[Layout], **extra) -> bytes:
    content = {"format_version": list(FORMAT_VERSION), "kind": kind, "name": name}
    if layout is not None:
        content.update(
            variables=list(layout.variables),
            layers=list(layout.layers),
            shapes=[None if s is None else list(s) for s in layout.shapes],
        )
    content.update(extra)
    return json.dumps(content, separators=(",", ":")).encode("utf-8")


def stats_metadata_content(name: str, layout: Layout) -> bytes:
    return _content(KIND_STATS, name, layout, stats=list(layout.stats))


def histogram_metadata_content(name: str, layout: Layout) -> bytes:
    return _content(
        KIND_HISTOGRAMS,
        name,
        layout,
        log10_edges=list(HISTOGRAM_LOG10_EDGES),
        bins=histogram_bin_labels(),
    )


def epochs_metadata_content(name: str) -> bytes:
    return _content(KIND_EPOCHS, name, None)


def create_summary_metadata(content: bytes, description: Optional[str] = None):
    """A `SummaryMetadata` proto for our plugin (TensorBoard's proto; no TensorFlow needed)."""
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.SummaryMetadata(
        summary_description=description or "",
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_plugin_data(content: bytes) -> PluginData:
    """Parses a tag's metadata content; refuses newer major versions and malformed content."""
    try:
        data = json.loads(bytes(content).decode("utf-8"))
        version = tuple(int(v) for v in data["format_version"])
    except (ValueError, KeyError, TypeError) as error:
        raise UnsupportedFormatError(
            f"gradients metadata is not valid tensorboard-gradients JSON: {error}"
        ) from error
    if version[0] > FORMAT_VERSION[0]:
        raise UnsupportedFormatError(
            f"these gradients were written in format {version[0]}.{version[1]}, newer than "
            f"format {FORMAT_VERSION[0]}.x that this tensorboard-gradients reads; upgrade it "
            "with `pip install -U tensorboard-gradients`"
        )
    try:
        kind = data["kind"]
        if kind == KIND_EPOCHS:
            return PluginData(kind=kind, name=data["name"], layout=None, format_version=version)
        if kind not in (KIND_STATS, KIND_HISTOGRAMS):
            raise ValueError(f"unknown kind {kind!r}")
        variables = tuple(data["variables"])
        layout = Layout(
            variables=variables,
            layers=tuple(data["layers"]),
            shapes=tuple(None if s is None else tuple(s) for s in data["shapes"]),
            stats=tuple(data.get("stats", ())),
        )
        if not len(layout.shapes) == len(layout.layers) == len(variables):
            raise ValueError("variables, layers and shapes differ in length")
        return PluginData(
            kind=kind,
            name=data["name"],
            layout=layout,
            format_version=version,
            log10_edges=tuple(data["log10_edges"]) if kind == KIND_HISTOGRAMS else None,
            bins=tuple(data["bins"]) if kind == KIND_HISTOGRAMS else None,
        )
    except (ValueError, KeyError, TypeError) as error:
        raise UnsupportedFormatError(
            f"gradients metadata is malformed: {error}"
        ) from error
