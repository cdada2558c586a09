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
below/above the edges, NaN and +-Inf (see `columns.histogram_bin_labels`).

Training monitors (the Keras `GradientMonitor`) also mark where epochs start: tag
``<name>_epochs`` (``kind = "epochs"``), one scalar per epoch = the epoch index (0-based, as Keras
counts), logged at the step that starts the epoch. Readers take the epochs of a name for every tag
of that name.

Monitors given the training loss log it beside the gradients: tag ``<name>_loss`` (``kind =
"loss"``), one float64 scalar per logged step (NaN and Inf as they were: a loss that went NaN is
the finding, not noise), at the step of that step's statistics. Readers take the loss of a name for
every tag of that name; a run without that tag has its loss read from its own scalars
(`LOSS_SCALARS`) where one is logged.

Metadata ``content`` is small UTF-8 JSON:

```text
{"format_version": [1, 7], "kind": "stats" | "histograms" | "epochs" | "loss" | "digest",
 "name": "gradients",
 "variables": [...], "layers": [...], "shapes": [[...], ...],
 "stats": [...]                      # kind == "stats"
 "every_step_stats": [...]           # kind == "stats", from 1.7 (see History)
 "stats_every_n_steps": N            # kind == "stats", N > 1 (1.6)
 "log10_edges": [...], "bins": [...] # kind == "histograms"
}                                    # kinds "epochs", "loss", "digest": no variables/...
```

The writer also keeps a digest of each stats tag (the classes, alerts and block summaries the
plugin would compute, see `analysis.digest`) and writes it as the run grows, so TensorBoard opens
a run of 100,000 steps without judging every step again: tags ``<stats tag>_digest`` and
``<stats tag>_digest_blocks``, plugin name ``gradients_digest`` (apart from ``gradients``, so
readers of the statistics never see it, and TensorBoard keeps one record of it:
`DIGEST_PLUGIN_NAME`), ``kind = "digest"``; one event every 1,000 steps and at close, with one
value of each tag, each a string tensor holding the arrays (`encode_digest`) of what
changed since the event before (`analysis.digest.Digest.record` lists the arrays; the blocks'
arrays, `analysis.digest.BLOCK_ARRAYS`, go under ``_digest_blocks``, which a reader needs only
from the last event that wrote every block). Readers use the records only when they match the
statistics they describe step for step, and read the statistics otherwise; a reader that does
not know the digest reads the statistics.

History: 1.0 stats + histograms; 1.1 adds the ``epochs`` kind and the ``update_l2_norm`` stat;
1.2 adds the ``digest`` kind; 1.3 lets ``stats`` hold a subset of the gradient stats (the ones
a writer was asked for, always including `columns.REQUIRED_STATS`; 1.0-1.2 writers wrote them
all). A 1.2 reader refuses a 1.3 tag that lacks a stat it requires, naming the stat. 1.4 adds
the ``loss`` kind (an older reader names such a tag unreadable and reads the rest); 1.5 adds the
``adam_rms`` stat (`columns.OPTIMIZER_STATS`), which an older reader shows by variable only; 1.6
adds norms-only steps: a stats tag whose content has ``"stats_every_n_steps": N`` (N > 1) holds
every statistic at least every N logged steps, and at the steps between only
`columns.EVERY_STEP_STATS` (the norms and non-finite counts), its other columns NaN (an older
reader shows those cells as without value). 1.7 names them: a stats tag's content has
``"every_step_stats": [...]``, the stats held at every step (`columns.every_step_stats`: the
weight norm only beside the update norm; a 1.6 tag held every one of `columns.EVERY_STEP_STATS`
it has, and a 1.6 reader assumes so, showing a 1.7 tag's weight norms between as without value).

Version policy: the minor version grows when fields are added that old readers may ignore; the
major version grows when old readers would misread the data, and readers refuse a newer major
version with ``UnsupportedFormatError`` instead of guessing.

Both TensorBoard loaders keep only the FIRST metadata seen for a tag, so the variable layout of a
tag never changes: when a writer sees a different variable set (or stat set) under a name it has
already used, it writes to ``<name>_varset<k>`` (k = 2, 3, ...) instead; see `layout.LayoutTags`.

What each stats column means is `columns.STATS`; what the rows are is `Layout`.
"""

import dataclasses
import functools
import json
import logging
import math
import zlib
from typing import Optional, Tuple, Union

import numpy as np

from tensorboard_gradients.format import columns
from tensorboard_gradients.format.layout import Layout

logger = logging.getLogger(__name__)

PLUGIN_NAME = "gradients"
DIGEST_PLUGIN_NAME = "gradients_digest"
FORMAT_VERSION = (1, 7)

KIND_STATS = "stats"
KIND_HISTOGRAMS = "histograms"
KIND_EPOCHS = "epochs"
KIND_LOSS = "loss"
KIND_DIGEST = "digest"

DEFAULT_NAME = "gradients"
HISTOGRAM_TAG_SUFFIX = "_histograms"
EPOCHS_TAG_SUFFIX = "_epochs"
LOSS_TAG_SUFFIX = "_loss"
# The run's own scalars that hold the training loss, looked for in this order when a run has no
# ``<name>_loss`` tag: what `torch.utils.tensorboard`, Keras' TensorBoard callback (``batch_loss``,
# ``epoch_loss``: per epoch, too coarse to judge steps, so not here), Lightning and the Hugging Face
# Trainer (``train/loss``, ``train_loss``) log. `read_logdir(loss_scalar=...)` and the plugin's
# ``--gradients_loss_scalar`` name another.
LOSS_SCALARS = ("loss", "train/loss", "train_loss", "batch_loss", "loss/train")
DIGEST_TAG_SUFFIX = "_digest"
DIGEST_BLOCKS_TAG_SUFFIX = "_digest_blocks"


class UnsupportedFormatError(ValueError):
    """Raised for data written in a format this version cannot read correctly."""


@dataclasses.dataclass(frozen=True)
class PluginData:
    """The parsed metadata content of one tag."""

    kind: str
    name: str
    layout: Optional[Layout]  # None for kinds "epochs", "loss" and "digest"
    format_version: Tuple[int, int]
    log10_edges: Optional[Tuple[float, ...]] = None
    bins: Optional[Tuple[str, ...]] = None


def histogram_tag(stats_tag: str) -> str:
    return stats_tag + HISTOGRAM_TAG_SUFFIX


def epochs_tag(name: str) -> str:
    return name + EPOCHS_TAG_SUFFIX


def loss_tag(name: str) -> str:
    return name + LOSS_TAG_SUFFIX


def loss_source(name: str, has_points, scalars=LOSS_SCALARS) -> Optional[str]:
    """The tag the loss of summary ``name`` is read from, the one policy of every reader: its
    ``<name>_loss`` tag, else the first of the run's own loss ``scalars`` (`LOSS_SCALARS`, or
    the ones a user named) for which ``has_points(tag)``; None without one."""
    return next((tag for tag in (loss_tag(name), *scalars) if has_points(tag)), None)


def digest_tag(stats_tag: str) -> str:
    return stats_tag + DIGEST_TAG_SUFFIX


def digest_blocks_tag(stats_tag: str) -> str:
    return stats_tag + DIGEST_BLOCKS_TAG_SUFFIX


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
    # Written only when there are norms-only steps: a 1.6 tag without them is a 1.5 tag.
    cadence = {"stats_every_n_steps": layout.stats_every} if layout.stats_every > 1 else {}
    return _content(KIND_STATS, name, layout, stats=list(layout.stats), **cadence,
                    every_step_stats=list(layout.every_step))


def histogram_metadata_content(name: str, layout: Layout) -> bytes:
    return _content(
        KIND_HISTOGRAMS,
        name,
        layout,
        log10_edges=list(columns.HISTOGRAM_LOG10_EDGES),
        bins=columns.histogram_bin_labels(),
    )


def epochs_metadata_content(name: str) -> bytes:
    return _content(KIND_EPOCHS, name, None)


def loss_metadata_content(name: str) -> bytes:
    return _content(KIND_LOSS, name, None)


def digest_metadata_content(name: str) -> bytes:
    return _content(KIND_DIGEST, name, None)


# The largest array a digest record may declare (a deflated one is inflated up to its declared
# size): the blocks of 2,000 steps of 10,000 variables x 12 stats are 1 GB.
_MAX_DIGEST_ARRAY_BYTES = 1 << 30


def encode_digest(arrays) -> bytes:
    """A digest record's tensor content: ``{name: numeric array}`` as a 4-byte little-endian
    header length, a JSON header (``{"arrays": [[name, dtype, shape, offset, bytes, deflated],
    ...]}``, offsets from the end of the header) and the arrays' bytes: integer arrays deflated
    (cell classes and counts are mostly alike), floats as they are (they hardly shrink, and a
    reader then maps them without a copy)."""
    entries, parts, offset = [], [], 0
    for name, array in arrays.items():
        array = np.asarray(array)
        data = array.tobytes()  # C order
        deflated = array.dtype.kind in "iub"
        if deflated:
            data = zlib.compress(data, 1)
        entries.append([name, array.dtype.str, list(array.shape), offset, len(data), deflated])
        parts.append(data)
        offset += len(data)
    header = json.dumps({"arrays": entries}, separators=(",", ":")).encode("utf-8")
    return len(header).to_bytes(4, "little") + header + b"".join(parts)


def decode_digest(payload: bytes):
    """``{name: array}`` of a digest record's content (`encode_digest`); float arrays are
    read-only views of ``payload``.

    Raises:
      UnsupportedFormatError: the content is not such a record.
    """
    try:
        size = int.from_bytes(payload[:4], "little")
        header = json.loads(bytes(payload[4:4 + size]).decode("utf-8"))
        data = memoryview(payload)[4 + size:]
        arrays = {}
        for name, dtype, shape, offset, length, deflated in header["arrays"]:
            dtype = np.dtype(dtype)
            if (dtype.kind not in "iubf" or not (0 <= offset <= offset + length <= len(data))
                    or math.prod(shape) * dtype.itemsize > _MAX_DIGEST_ARRAY_BYTES):
                raise ValueError(f"array {name!r} is not a numeric array inside the record")
            raw = data[offset:offset + length]
            if deflated:  # bounded: what the header says, no more (zlib reads 0 as no bound)
                expected = math.prod(shape) * dtype.itemsize
                raw = zlib.decompressobj().decompress(raw, max(expected, 1))
                if len(raw) != expected:
                    raise ValueError(f"array {name!r} inflates to other than its size")
            arrays[str(name)] = np.frombuffer(raw, dtype=dtype).reshape(shape)
        return arrays
    except (ValueError, TypeError, KeyError, OverflowError, SyntaxError, zlib.error,
            RecursionError) as error:  # numpy parses a dtype string with Python's parser
        raise UnsupportedFormatError(f"a gradients digest record does not read: {error}") from None


def create_summary_metadata(content: bytes, description: Optional[str] = None,
                            plugin_name: str = PLUGIN_NAME):
    """A `SummaryMetadata` proto for our plugin (TensorBoard's proto; no TensorFlow needed)."""
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.SummaryMetadata(
        summary_description=description or "",
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=plugin_name, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


# Bounds on what a tag's metadata content may declare. A real content is small (2,000 variables:
# about 150 KB); the cap keeps a crafted one from costing more than parsing a few MB.
MAX_CONTENT_BYTES = 16 * 1024 * 1024
# Format versions are small counters: a huge number is damage, not a future format.
_MAX_VERSION_NUMBER = 1000
_MAX_DIMENSION = 2**63 - 1
# Parsed contents kept: the plugin parses every tag's content on every request.
_PARSE_CACHE_SIZE = 512
# The largest ``stats_every_n_steps`` read: a stream keeps (sustain_steps - 1) times as many rows
# to judge the dead rule over steps with every statistic (`analysis.stream`); a crafted cadence
# must not make a reader keep a run's worth.
MAX_STATS_EVERY = 1000


def parse_plugin_data(content: bytes) -> PluginData:
    """Parses and validates a tag's metadata content (fields: see the module docstring).

    Every fact a reader relies on is checked here: the version is ``[major, minor]`` (integers,
    ``1 <= major``), ``kind`` and ``name`` are strings, ``variables`` are unique strings with as
    many ``layers`` (strings) and ``shapes`` (null or lists of sizes); a stats tag's ``stats`` are
    unique strings including every name of `columns.REQUIRED_STATS` (other gradient stats are
    optional from format 1.3); a histograms tag has
    `HISTOGRAM_BINS` string ``bins`` and increasing finite ``log10_edges`` around them. Names
    must be valid Unicode (no lone surrogates), so they can be printed and served.

    Memoised on the content bytes (errors too): the plugin re-lists every tag on each request.

    Raises:
      UnsupportedFormatError: the only exception for ANY content: a newer major version (the
        message says to upgrade), or content that is not such JSON (the message says what is
        wrong). Fields a newer minor version added are ignored.
    """
    outcome = _parse_content(bytes(content))
    if isinstance(outcome, str):
        raise UnsupportedFormatError(outcome)
    return outcome


@functools.lru_cache(maxsize=_PARSE_CACHE_SIZE)
def _parse_content(content: bytes) -> Union[PluginData, str]:
    """`parse_plugin_data`'s work: the `PluginData`, or why the content is refused."""
    try:
        return _validated_plugin_data(content)
    except UnsupportedFormatError as error:
        return str(error)


def _every_step(data: dict, stats: Tuple[str, ...]) -> Tuple[str, ...]:
    """A stats tag's ``every_step_stats`` (format 1.7): some of its ``stats``, among them every
    one of `columns.EVERY_STEP_STATS` that the rules judge at every step whatever the writer
    (`columns.REQUIRED_STATS`). A 1.6 writer logged all of `columns.EVERY_STEP_STATS` there."""
    if "every_step_stats" not in data:
        return columns.every_step_stats_1_6(stats)
    every_step = _unique(_strings(data, "every_step_stats"), "every_step_stats")
    foreign = [s for s in every_step if s not in stats]
    _require(not foreign, f"'every_step_stats' names {', '.join(foreign)}, not in 'stats'")
    absent = [s for s in columns.REQUIRED_STATS
              if s in columns.EVERY_STEP_STATS and s not in every_step]
    _require(not absent, f"'every_step_stats' lacks {', '.join(absent)}")
    return every_step


def _validated_plugin_data(content: bytes) -> PluginData:
    if len(content) > MAX_CONTENT_BYTES:
        raise _malformed(f"{len(content)} bytes, more than the {MAX_CONTENT_BYTES} accepted")
    try:
        data = json.loads(content.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise UnsupportedFormatError(
            f"gradients metadata is not valid tensorboard-gradients JSON: {error}"
        ) from None
    _require(isinstance(data, dict), f"the content is {_shown(data)}, not a JSON object")
    version = _format_version(data.get("format_version"))
    if version[0] > FORMAT_VERSION[0]:
        raise UnsupportedFormatError(
            f"these gradients were written in format {version[0]}.{version[1]}, newer than "
            f"format {FORMAT_VERSION[0]}.x that this tensorboard-gradients reads; upgrade it "
            "with `pip install -U tensorboard-gradients`"
        )
    kind = data.get("kind")
    _require(
        kind in (KIND_STATS, KIND_HISTOGRAMS, KIND_EPOCHS, KIND_LOSS, KIND_DIGEST),
        f"'kind' is {_shown(kind)}, not {KIND_STATS!r}, {KIND_HISTOGRAMS!r}, {KIND_EPOCHS!r}, "
        f"{KIND_LOSS!r} or {KIND_DIGEST!r}",
    )
    name = data.get("name")
    _require(_is_text(name), f"'name' is {_shown(name)}, not a string")
    if kind in (KIND_EPOCHS, KIND_LOSS, KIND_DIGEST):
        return PluginData(kind=kind, name=name, layout=None, format_version=version)
    variables = _unique(_strings(data, "variables"), "variables")
    layers = _strings(data, "layers")
    _require(
        len(layers) == len(variables),
        f"{len(layers)} 'layers' for {len(variables)} 'variables'",
    )
    shapes = _shapes(data.get("shapes"), len(variables))
    if kind == KIND_STATS:
        stats = _unique(_strings(data, "stats"), "stats")
        absent = [s for s in columns.REQUIRED_STATS if s not in stats]
        _require(not absent, f"'stats' lacks {', '.join(absent)}")
        stats_every = data.get("stats_every_n_steps", 1)
        _require(_is_int(stats_every) and 1 <= stats_every <= MAX_STATS_EVERY,
                 f"'stats_every_n_steps' is {_shown(stats_every)}, not an integer from 1 to "
                 f"{MAX_STATS_EVERY}")
        return PluginData(
            kind=kind,
            name=name,
            layout=Layout(variables=variables, layers=layers, shapes=shapes, stats=stats,
                          stats_every=stats_every, every_step=_every_step(data, stats)),
            format_version=version,
        )
    bins = _strings(data, "bins")
    _require(
        len(bins) == columns.HISTOGRAM_BINS, f"{len(bins)} 'bins', not {columns.HISTOGRAM_BINS}"
    )
    return PluginData(
        kind=kind,
        name=name,
        layout=Layout(variables=variables, layers=layers, shapes=shapes, stats=()),
        format_version=version,
        log10_edges=_log10_edges(data.get("log10_edges")),
        bins=bins,
    )


def _malformed(what: str) -> UnsupportedFormatError:
    return UnsupportedFormatError(f"gradients metadata is malformed: {what}")


def _require(condition: bool, what: str):
    if not condition:
        raise _malformed(what)


def _shown(value) -> str:
    """A short description of a JSON value for an error message (never the whole of it)."""
    if value is None:
        return "missing (or null)"
    flat_list = isinstance(value, list) and len(value) <= 8 and not any(
        isinstance(v, (list, dict)) for v in value
    )
    if isinstance(value, (list, dict)) and not flat_list:  # repr could recurse as deep as JSON
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value) -> bool:
    return type(value) is int  # JSON integers are exact ints; bool (a subclass) is not one


def _is_text(value) -> bool:
    """A str that is valid Unicode: JSON's ``\\ud800`` escapes decode to lone surrogates, which
    neither a terminal, a file nor an HTTP answer can carry."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_shape(value) -> bool:
    return value is None or (
        isinstance(value, list) and all(_is_int(d) and 0 <= d <= _MAX_DIMENSION for d in value)
    )


def _first_failing(values, check) -> Optional[int]:
    return next((index for index, value in enumerate(values) if not check(value)), None)


def _format_version(value) -> Tuple[int, int]:
    _require(
        isinstance(value, list)
        and len(value) == 2
        and all(_is_int(v) and 0 <= v <= _MAX_VERSION_NUMBER for v in value)
        and value[0] >= 1,
        f"'format_version' is {_shown(value)}, not [major, minor] (integers up to "
        f"{_MAX_VERSION_NUMBER}, major at least 1)",
    )
    return (value[0], value[1])


def _strings(data: dict, key: str) -> Tuple[str, ...]:
    values = data.get(key)
    _require(isinstance(values, list), f"{key!r} is {_shown(values)}, not a list of strings")
    # One encode of all of them: a per-string check costs more than parsing the JSON.
    if not (all(isinstance(v, str) for v in values) and _is_text("".join(values))):
        index = _first_failing(values, _is_text)
        value = values[index]
        problem = "not valid Unicode" if isinstance(value, str) else "not a string"
        raise _malformed(f"{key}[{index}] is {_shown(value)}, {problem}")
    return tuple(values)


def _unique(names: Tuple[str, ...], key: str) -> Tuple[str, ...]:
    if len(set(names)) != len(names):
        seen = set()
        for name in names:
            _require(name not in seen, f"{key!r} names {_shown(name)} twice")
            seen.add(name)
    return names


def _shapes(value, count: int) -> Tuple[Optional[Tuple[int, ...]], ...]:
    _require(
        isinstance(value, list) and len(value) == count,
        f"'shapes' is {_shown(value)}, not a list of {count} shapes (one per variable)",
    )
    index = _first_failing(value, _is_shape)
    if index is not None:
        raise _malformed(f"shapes[{index}] is {_shown(value[index])}, not null or a list of sizes")
    return tuple(None if shape is None else tuple(shape) for shape in value)


def _log10_edges(value) -> Tuple[float, ...]:
    count = columns.HISTOGRAM_LOG_BINS + 1
    _require(
        isinstance(value, list) and len(value) == count,
        f"'log10_edges' is {_shown(value)}, not a list of {count} edges",
    )
    index = _first_failing(value, lambda e: isinstance(e, float) and math.isfinite(e))
    if index is not None:
        raise _malformed(f"log10_edges[{index}] is {_shown(value[index])}, not a finite float")
    index = next((i for i in range(1, count) if not value[i - 1] < value[i]), None)
    if index is not None:
        raise _malformed(f"log10_edges[{index}] is {value[index]!r}, not above the edge before it")
    return tuple(value)
