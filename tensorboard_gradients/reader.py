"""`read_logdir`: the logged gradient history back as numpy arrays (TF-free).

Reads the event files directly (not through TensorBoard's loaders, which sample a few points per
tag), so every logged step comes back.
"""

import dataclasses
import logging
import os
from typing import Dict, Optional, Tuple

import numpy as np
from tensorboard.util import tensor_util

from tensorboard_gradients import event_files, metadata

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GradientHistograms:
    """The log10|g| histograms of one tag: ``counts[step, variable, bin]``."""

    steps: np.ndarray
    wall_times: np.ndarray
    counts: np.ndarray
    log10_edges: Tuple[float, ...]
    bin_labels: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class GradientSeries:
    """Every logged step of one run's tag: ``values[step, variable, stat]``.

    Rows are in model order (input side first). A missing gradient is NaN in every stat (see
    `missing`); a gradient with NaN/Inf entries has ``nan_count``/``inf_count`` > 0.
    """

    run: str
    tag: str
    name: str
    variables: Tuple[str, ...]
    layers: Tuple[str, ...]
    shapes: Tuple[Optional[Tuple[int, ...]], ...]
    stat_names: Tuple[str, ...]
    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray
    histograms: Optional[GradientHistograms] = None
    # Where epochs start, when a training monitor marked them: the first step of each epoch and
    # its 0-based epoch index (None when the writer recorded no epochs).
    epoch_starts: Optional[np.ndarray] = None
    epoch_indices: Optional[np.ndarray] = None

    def stat(self, name: str) -> np.ndarray:
        """``[steps, variables]`` of one statistic, e.g. ``series.stat("l2_norm")``."""
        if name not in self.stat_names:
            raise KeyError(f"no stat {name!r} in {self.run}/{self.tag}; have {list(self.stat_names)}")
        return self.values[:, :, self.stat_names.index(name)]

    @property
    def missing(self) -> np.ndarray:
        """``[steps, variables]``: True where the variable had no gradient at that step."""
        return np.isnan(self.stat("size"))


class _TagData:
    def __init__(self, plugin_data):
        self.plugin_data = plugin_data
        self.by_step = {}  # step -> (wall_time, matrix); a rewritten step keeps its last value


def _expected_shape(parsed):
    if parsed.kind == metadata.KIND_EPOCHS:
        return ()
    columns = len(parsed.layout.stats) if parsed.kind == metadata.KIND_STATS else len(parsed.bins)
    return (len(parsed.layout.variables), columns)


def _read_run(directory, files):
    tags: Dict[str, _TagData] = {}
    expected_shapes = {}
    rejected = {}
    for filename in sorted(files):
        for event in event_files.read_events(os.path.join(directory, filename)):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.tag not in tags:
                    plugin = value.metadata.plugin_data
                    if plugin.plugin_name != metadata.PLUGIN_NAME:
                        continue
                    try:
                        parsed = metadata.parse_plugin_data(plugin.content)
                    except metadata.UnsupportedFormatError as error:
                        raise metadata.UnsupportedFormatError(
                            f"{os.path.join(directory, filename)}, tag {value.tag!r}: {error}"
                        ) from None
                    tags[value.tag] = _TagData(parsed)
                    expected_shapes[value.tag] = _expected_shape(parsed)
                matrix = tensor_util.make_ndarray(value.tensor)
                if matrix.shape != expected_shapes[value.tag]:
                    rejected[value.tag] = rejected.get(value.tag, 0) + 1
                    continue
                tags[value.tag].by_step[event.step] = (event.wall_time, matrix)
    for tag, count in rejected.items():
        logger.warning(
            "%s: skipped %d step(s) of tag %r whose matrix shape differs from the tag's metadata "
            "(another process wrote a different variable set under the same name)",
            directory,
            count,
            tag,
        )
    return tags


def _arrays(tag_data):
    steps = sorted(tag_data.by_step)
    wall_times = np.array([tag_data.by_step[s][0] for s in steps], dtype=np.float64)
    matrices = [tag_data.by_step[s][1] for s in steps]
    return np.array(steps, dtype=np.int64), wall_times, np.stack(matrices)


def read_logdir(logdir: str) -> Dict[str, Dict[str, GradientSeries]]:
    """Reads every gradient summary under ``logdir``.

    Returns:
      ``{run: {tag: GradientSeries}}`` where a run is an event-file directory relative to
      ``logdir`` (``"."`` for ``logdir`` itself, as TensorBoard names it). Histograms logged for a
      tag are attached to its series as ``series.histograms``.

    Raises:
      FileNotFoundError: ``logdir`` does not exist.
      metadata.UnsupportedFormatError: data written by a newer, incompatible format version.
    """
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"no such log directory: {logdir!r}")
    result = {}
    for directory, _, files in sorted(os.walk(logdir)):
        event_file_names = [f for f in files if event_files.is_event_file(f)]
        if not event_file_names:
            continue
        tags = _read_run(directory, event_file_names)
        run_name = os.path.relpath(directory, logdir).replace(os.sep, "/")
        series = {}
        for tag, data in tags.items():
            if data.plugin_data.kind != metadata.KIND_STATS or not data.by_step:
                continue
            histograms = None
            histogram_data = tags.get(metadata.histogram_tag(tag))
            if histogram_data is not None and histogram_data.by_step:
                h_steps, h_walls, counts = _arrays(histogram_data)
                histograms = GradientHistograms(
                    steps=h_steps,
                    wall_times=h_walls,
                    counts=counts,
                    log10_edges=histogram_data.plugin_data.log10_edges,
                    bin_labels=histogram_data.plugin_data.bins,
                )
            steps, wall_times, values = _arrays(data)
            layout = data.plugin_data.layout
            epoch_data = tags.get(metadata.epochs_tag(data.plugin_data.name))
            epoch_starts = epoch_indices = None
            if epoch_data is not None and epoch_data.by_step:
                epoch_starts, _, epoch_values = _arrays(epoch_data)
                epoch_indices = epoch_values.astype(np.int64)
            series[tag] = GradientSeries(
                run=run_name,
                tag=tag,
                name=data.plugin_data.name,
                variables=layout.variables,
                layers=layout.layers,
                shapes=layout.shapes,
                stat_names=layout.stats,
                steps=steps,
                wall_times=wall_times,
                values=values,
                histograms=histograms,
                epoch_starts=epoch_starts,
                epoch_indices=epoch_indices,
            )
        if series:
            result[run_name] = series
    return result
