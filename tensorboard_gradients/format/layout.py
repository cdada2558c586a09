"""What the rows of a tag's matrices are: variable names, their layers and shapes (`Layout`),
and which tag each layout is written under (`LayoutTags`).

Both TensorBoard loaders keep only the FIRST metadata seen for a tag, so the variable layout of a
tag never changes: when a writer sees a different variable set (or stat set) under a name it has
already used, it writes to ``<name>_varset<k>`` (k = 2, 3, ...) instead.
"""

import dataclasses
import hashlib
import logging
import re
from typing import Optional, Sequence, Tuple

from tensorboard_gradients.format import columns

logger = logging.getLogger(__name__)

# How the k-th layout of a summary name is tagged: ``<name>_varset<k>`` (k >= 2).
VARSET_TAG_INFIX = "_varset"

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
    # Every statistic is logged at least every this many logged steps; the steps between hold
    # only `columns.EVERY_STEP_STATS` (format 1.6; a monitor's ``stats_every_n_steps``). Not
    # part of what tells tags apart (`rows_and_columns`): a run resumed with another cadence
    # goes on in its tag.
    stats_every: int = 1
    # Of `stats`, those logged at the norms-only steps too (`columns.every_step_stats`; the
    # metadata's ``every_step_stats``, format 1.7). None: what a writer of this version logs.
    every_step: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        if self.every_step is None:
            object.__setattr__(self, "every_step", columns.every_step_stats(self.stats))

    @property
    def rows_and_columns(self):
        """What a logged matrix's rows and columns mean: the variable names and the stats.
        Shapes aside, so a writer that learns a shape later (a gradient missing at first, a
        restarted job) still writes the same layout; tags are told apart by this alone."""
        return self.variables, self.stats

    @classmethod
    def create(
        cls, variables: Sequence[str], shapes, with_weights: bool, with_updates: bool = False,
        gradient_stats: Sequence[str] = columns.GRADIENT_STATS, with_optimizer: bool = False,
        stats_every: int = 1,
    ) -> "Layout":
        """The layout of ``variables`` (names cleaned, capped and made unique) whose matrices hold
        the ``gradient_stats`` (`columns.gradient_stats`), then the weight, update and optimizer
        stats (`columns.stats_for`)."""
        names = unique_names([_capped(_valid_unicode(clean_variable_name(v))) for v in variables])
        return cls(
            variables=tuple(names),
            layers=tuple(layer_of(v) for v in names),
            shapes=tuple(None if s is None else tuple(int(d) for d in s) for s in shapes),
            stats=columns.stats_for(with_weights, with_updates, gradient_stats, with_optimizer),
            stats_every=int(stats_every),
        )


# Longer variable names are cut (with a warning): a name is shown in a table row and travels in
# URLs, and a 64 KB one made the details request exceed the HTTP server's request-line limit.
MAX_VARIABLE_NAME_LENGTH = 1000
_CAPPED_WARNED = set()


def _valid_unicode(name: str) -> str:
    """`name` with lone surrogates (undecodable bytes of a file name, say) written as ``\\udcxx``:
    readers refuse metadata that is not valid Unicode."""
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


def _capped(name: str) -> str:
    """`name`, or its first characters + a hash of the whole (distinct long names stay distinct)."""
    if len(name) <= MAX_VARIABLE_NAME_LENGTH:
        return name
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:12]
    capped = f"{name[:MAX_VARIABLE_NAME_LENGTH - 16]}...{digest}"
    if name not in _CAPPED_WARNED:
        _CAPPED_WARNED.add(name)
        logger.warning("variable name of %d characters logged as %r (at most %d are kept)",
                       len(name), capped[:60] + "...", MAX_VARIABLE_NAME_LENGTH)
    return capped


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



class LayoutTags:
    """Chooses the tag for each layout under a summary name, per writer.

    The first layout seen under ``name`` gets tag ``name``; each different later layout gets
    ``name_varset2``, ``name_varset3``, ... so no tag ever mixes two layouts. A layout is told
    apart by its variable NAMES and stats, never by counts or shapes: a renamed or reordered
    variable set of the same size gets its own tag, while a step whose missing gradient leaves
    a shape unknown stays in its tag. `known` registers the tags a run directory already holds
    (written by earlier processes), so a new writer reuses or avoids them.
    """

    def __init__(self):
        self._tags = {}

    def known(self, name: str, tag: str, layout: Layout):
        """Records that ``tag`` (``name`` or ``name_varset<k>``) already holds ``layout``."""
        self._tags.setdefault(name, {}).setdefault(layout.rows_and_columns, tag)

    def tag_for(self, name: str, layout: Layout) -> str:
        layouts = self._tags.setdefault(name, {})
        key = layout.rows_and_columns
        if key not in layouts:
            used = set(layouts.values())
            index = 1
            while (name if index == 1 else f"{name}{VARSET_TAG_INFIX}{index}") in used:
                index += 1
            layouts[key] = name if index == 1 else f"{name}{VARSET_TAG_INFIX}{index}"
        return layouts[key]


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
