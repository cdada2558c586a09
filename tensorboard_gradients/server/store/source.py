"""`RunSource`: what the routes read of one stats tag, wherever it is read from, and the errors
they answer with.

Every answer is built from the same few things (`server.answers`): the tag's variables and
stats (`like`), its logged steps, a `analysis.digest.Digest` under the asked thresholds
(classes, alerts, per-block heatmap groups) with how many steps it has still to read, the
rows of a step range at full resolution, the histograms nearest a step, and what was left out
as damaged. A short run is simply a digest of one-step blocks, so no answer has a branch for
long runs. The two implementations: `local.LocalSource` (the plugin's own reader of a local
logdir's event files) and `provider.ProviderSource` (TensorBoard's data provider, for what only
it can read); `registry.Store` picks one per tag.
"""

import abc
import collections
import contextlib
import dataclasses
import functools
import logging
from typing import Iterator, Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.format import metadata
from tensorboard_gradients.format.series import GradientSeries

logger = logging.getLogger(__name__)


class UnknownError(LookupError):
    """An unknown run, tag, variable or stat (the plugin answers 404)."""


class UnreadableTagError(ValueError):
    """A tag whose metadata or data cannot be read (the plugin answers 400; ``runs`` lists the
    tag with `reason`)."""

    def __init__(self, run: str, tag: str, reason: str):
        super().__init__(f"run {run!r}, tag {tag!r}: {reason}")
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class TagInfo:
    """One tag of this plugin as listed: its metadata (None when unreadable, see ``error``)
    and what changes when it grows (``signature``); a local tag's ``look`` at its run's files
    (`event_scan.RunLook`), which its source is built from."""

    parsed: Optional[metadata.PluginData]
    signature: tuple
    error: Optional[str] = None
    look: Optional[object] = None


def parsed_info(content: bytes, signature: tuple = ()) -> TagInfo:
    """The `TagInfo` of a tag whose first metadata is ``content``: unreadable metadata is the
    tag's own error, never the listing's."""
    try:
        return TagInfo(metadata.parse_plugin_data(content), signature)
    except metadata.UnsupportedFormatError as error:
        return TagInfo(None, signature, error=str(error))
    except Exception as error:  # noqa: BLE001 - one tag must not hide every run
        logger.exception("a tag's metadata could not be parsed")
        return TagInfo(None, signature, error=f"its metadata cannot be read ({error})")


@functools.lru_cache(maxsize=4096)
def parsed_content(content: bytes) -> TagInfo:
    """`parsed_info` of a local tag's metadata, parsed once per distinct content (a runs list of
    2,000 tags, and the scan that checks their tensors, share it)."""
    return parsed_info(content)


@dataclasses.dataclass(frozen=True)
class HistogramAt:
    """The histograms of one logged step (`RunSource.histogram_near`)."""

    steps: np.ndarray  # every logged step with histograms
    index: int  # this one's position in ``steps``
    wall_time: float
    counts: np.ndarray  # [variables, bins]
    log10_edges: Tuple[float, ...]
    bin_labels: Tuple[str, ...]


class RunSource(abc.ABC):
    """One stats tag of one run, as the routes read it (thread-safe).

    ``like`` has the tag's variables, layers, shapes, stats and epoch marks and no steps;
    ``sampled`` says why not every logged step is served (or None); ``derived`` keeps what
    routes derived from this source while it is current (`registry.Store.memo`).
    """

    like: GradientSeries
    sampled: Optional[str] = None

    def __init__(self, like: GradientSeries):
        self.like = like
        self.derived: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()

    @property
    def run(self) -> str:
        return self.like.run

    @property
    def tag(self) -> str:
        return self.like.tag

    @abc.abstractmethod
    def steps(self) -> np.ndarray:
        """Every logged step served, in order."""

    @abc.abstractmethod
    def rows(self, start: int, stop: int) -> GradientSeries:
        """Logged steps ``start:stop`` (positions in `steps`) with their values, no epoch
        marks; a step that no longer reads back is left out (and counted in `damage`)."""

    @abc.abstractmethod
    def reading(self, thresholds: analysis.Thresholds) -> "contextlib.AbstractContextManager":
        """A context yielding ``(digest, steps not read into it yet)`` under ``thresholds``;
        nothing changes the digest while it is open."""

    def progress(self, thresholds: analysis.Thresholds) -> int:
        """How many steps the digest under ``thresholds`` has read (a kept answer is only
        served again while this is unchanged)."""
        with self.reading(thresholds) as (digest, _):
            return digest.rows

    @abc.abstractmethod
    def histogram_near(self, step: int) -> HistogramAt:
        """The histograms logged at the logged step nearest ``step`` (ties: the earlier), their
        rows the tag's variables; `UnknownError` if none were, or they are left out."""

    @property
    @abc.abstractmethod
    def has_histograms(self) -> bool:
        """Whether `histogram_near` has histograms to answer with."""

    @abc.abstractmethod
    def damage(self) -> Tuple[int, Tuple[str, ...]]:
        """(logged steps of the tag left out as damaged, the sentences that say what was left
        out of it, its histograms and epoch marks, and why)."""

    def pieces(self, steps_per_piece: int = 1000) -> Iterator[GradientSeries]:
        """Every logged step, a few at a time (a generator of `GradientSeries`)."""
        for start in range(0, len(self.steps()), steps_per_piece):
            yield self.rows(start, start + steps_per_piece)


def nearest_index(steps: np.ndarray, step: int) -> int:
    """The index of the logged step nearest ``step`` in sorted ``steps`` (ties: the earlier),
    in Python integers: int64 arithmetic would overflow for steps far apart."""
    after = int(np.searchsorted(steps, step))
    candidates = [i for i in (after - 1, after) if 0 <= i < len(steps)]
    return min(candidates, key=lambda i: (abs(int(steps[i]) - step), i))
