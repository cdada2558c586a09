"""What each route answers, as plain data: callable without HTTP (TensorBoard's ``*_impl``).

Each function takes the data access object (`data_access.GradientData`), the loaded series
where the answer is about one (`GradientData.series`), and parsed parameters, and returns the
JSON-ready dict the route sends: numbers encoded by `encoding` (non-finite values as strings),
before the JSON text and gzip. Errors are exceptions, which `responses` maps to status codes:
`data_access.UnknownError` (404), `ValueError` (400). The routes (`plugin`) parse the query,
load, call these and respond; a test calls them directly.
"""

import contextlib
import dataclasses
from typing import Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import groups, heatmap, layers
from tensorboard_gradients.format import inventory
from tensorboard_gradients.server import encoding, vocabulary
from tensorboard_gradients.server.data_access import (
    GradientData,
    Loaded,
    UnknownError,
    UnreadableTagError,
)

# A heatmap's columns, at most and by default: more than any screen shows. The work and the
# answer scale with columns x variables, so the bound is what keeps one request cheap.
MAX_COLUMNS = 10_000
# A zoom into a long run (`long_runs`) at most this many logged steps wide is read back at
# full resolution (1,000 variables: ~90 MB decoded, well under a second); wider ones merge blocks.
FULL_RESOLUTION_STEPS = 2000
# JSON lists cost about 1 us and 100 bytes of memory per cell to encode (base64 a few ns and 5
# bytes): 10,000 columns of 1,000 variables took 14 s and 650 MB, so a JSON answer merges its
# columns to stay within this many cells.
MAX_JSON_CELLS = 1_000_000


def runs_overview(data: GradientData, ctx, experiment) -> dict:
    """``{run: {tag: overview}}`` of every stats tag: sizes, stat names and which extras
    (histograms, epochs) exist; ``"not_logged"`` lists the gradient stats its writer left out
    (`GradientSeries.unlogged_stats`), only when it left some out.

    A tag that cannot be read (metadata this version cannot read, data that cannot be decoded)
    is listed with an ``"error"`` message; every other tag is served as usual.
    """
    tags = data.tags(ctx, experiment)
    result = {}
    for run, tag in data.listed_tags(tags):
        result.setdefault(run, {})[tag] = _tag_overview(data, ctx, experiment, run, tag, tags)
    return result


def _tag_overview(data, ctx, experiment, run, tag, tags) -> dict:
    try:
        loaded = data.series(ctx, experiment, run, tag, tags)
    except UnreadableTagError as error:
        return {"variables": 0, "steps": 0, "stats": [], "histograms": False, "epochs": 0,
                "error": error.reason}
    series = loaded.series
    overview = {
        "variables": len(series.variables),
        "steps": _step_count(loaded),
        "stats": list(series.available_stats),
        "histograms": data.has_histograms(tags, run, tag),
        "epochs": 0 if series.epoch_starts is None else len(series.epoch_starts),
        "sampled": loaded.sampled,
    }
    if series.unlogged_stats:  # like "error": only there when there are some
        overview["not_logged"] = list(series.unlogged_stats)
    damage = _damage_fields(loaded)
    if damage["damaged"] or damage["damage"]:  # like "error": only there when there is some
        overview.update(damage)
    return overview


def _step_count(loaded: Loaded) -> int:
    return len(loaded.long_run.steps if loaded.long_run else loaded.series.steps)


def _damage_fields(loaded: Loaded) -> dict:
    # A long run's points are read back while answering: what they lost is known only now.
    lost = loaded.long_run.lost_messages() if loaded.long_run is not None else ()
    return {"damaged": loaded.damaged, "damage": list(loaded.damage) + list(lost)}


def _epochs(series):
    return None if series.epoch_starts is None else series.epoch_starts.tolist()


@dataclasses.dataclass(frozen=True)
class HeatmapQuery:
    """The parameters of a heatmap; equal queries get the same answer (a key of what is kept).

    ``max_steps``: at most that many columns (None: `MAX_COLUMNS`); ``by_epoch``: one column
    per epoch; ``packed``: the matrix as typed arrays (`encoding.packed_matrix`);
    ``step_range``: ``(first, last)`` logged steps, inclusive (a zoom); ``by_layer``: one row
    per layer (`layers.combined`).
    """

    stat: str
    max_steps: Optional[int] = None
    by_epoch: bool = False
    packed: bool = False
    step_range: Optional[Tuple[int, int]] = None
    by_layer: bool = False
    thresholds: analysis.Thresholds = dataclasses.field(default_factory=analysis.Thresholds)

    def bounded(self, loaded: Loaded) -> "HeatmapQuery":
        """The same query with ``max_steps`` as answered for this series (`UnknownError` for a
        stat it does not have, a `ValueError` naming the logged ones for a gradient stat its
        writer did not log). Idempotent."""
        series = loaded.series
        if self.stat in series.unlogged_stats:
            # A 400, not a 404: the stat exists, this tag's writer was asked for others.
            raise ValueError(
                f"stat {self.stat!r} was not logged in run {series.run!r}, tag {series.tag!r}: "
                f"its writer logged only {', '.join(series.stat_names)} (a writer's stats= "
                "chooses the gradient stats)"
            )
        if self.stat not in series.available_stats:
            raise UnknownError(
                f"no stat {self.stat!r} in run {series.run!r}, tag {series.tag!r}; "
                f"have {', '.join(series.available_stats)}"
            )
        max_steps = self.max_steps or MAX_COLUMNS
        if not self.packed:
            max_steps = min(max_steps, max(1, MAX_JSON_CELLS // max(1, len(series.variables))))
        # Any bound at or above the logged steps is the same answer: one kept copy of it.
        max_steps = min(max_steps, max(1, _step_count(loaded)))
        return dataclasses.replace(self, max_steps=max_steps)


def heatmap_answer(data: GradientData, loaded: Loaded, query: HeatmapQuery) -> dict:
    """The layer x step matrix of one stat, coloured by `analysis.classify`.

    ``values``/``classes`` are ``[variable][column]`` (rows in model order). With more logged
    steps than ``max_steps`` (at most and by default `MAX_COLUMNS`), consecutive steps merge
    into one column by the never-hide-the-worst rule (`heatmap.merge`); ``steps``/
    ``last_steps`` give each column's step range. JSON answers merge to at most
    `MAX_JSON_CELLS` cells (``downsampled`` says so); base64 ones are exactly as asked.
    ``by_epoch`` makes one column per epoch (adds ``epoch_index``; `heatmap.NoEpochsError`, a
    ValueError, without epoch marks). ``packed`` packs ``values``/``classes`` as typed arrays
    (`encoding.packed_matrix`). ``step_range`` zooms into a step range; cells keep the classes
    judged on the whole run. ``by_layer`` draws one row per layer: its variables combined as
    one tensor (`analysis.layers`), its class their worst; ``variables`` and ``layers`` are
    then both the layer names. A long run's overview combines its variables' merged columns
    (a column's layer norm is then the root of summed squares of its variables' merged norms);
    a zoom of at most `FULL_RESOLUTION_STEPS` steps combines every step exactly.
    ``sampled`` explains when TensorBoard could not deliver every logged step (else null);
    ``steps_to_read`` counts the logged steps of a long run the plugin has still to read (the
    tab asks again until it is 0); ``damaged``/``damage`` count and explain logged steps left
    out as damaged.
    """
    query = query.bounded(loaded)
    series = loaded.series
    progress = _read_whole(loaded)
    if loaded.long_run is not None:
        matrix, progress = _long_heatmap(loaded.long_run, query)
    else:
        classes = data.analysis(loaded, query.thresholds).classes
        rows = series
        if query.by_layer:
            rows, classes = _loaded_by_layer(data, loaded, classes)
        matrix = heatmap.build(rows, query.stat, classes, query.max_steps, query.by_epoch,
                               query.step_range)
    names = row_names(series.variables, series.layers, query.by_layer)
    payload = {
        "run": series.run,
        "tag": series.tag,
        "stat": query.stat,
        "rows": "layers" if query.by_layer else "variables",
        "variables": list(names),
        "layers": list(names) if query.by_layer else list(series.layers),
        "steps": matrix.steps.tolist(),
        "last_steps": matrix.last_steps.tolist(),
        "wall_times": encoding.floats(matrix.wall_times),
        "epochs": _epochs(series),
        "downsampled": matrix.downsampled or progress["sampled"] is not None,
        **progress,
        **_damage_fields(loaded),
    }
    if query.packed:
        payload.update(encoding.packed_matrix(matrix.values, matrix.classes))
    else:
        payload.update(values=encoding.floats(matrix.values),
                       classes=encoding.class_names(matrix.classes))
    if query.by_epoch:
        payload["epoch_index"] = matrix.epoch_index.tolist()
    return payload


def _long_heatmap(long_run, query: HeatmapQuery):
    """(the heatmap of a long run, how far it is read: `_digest_of`). A zoom into at most
    `FULL_RESOLUTION_STEPS` logged steps reads them back and merges them as a short run's;
    anything wider merges whole blocks of the digest (the blocks at the ends of a zoom whole)."""
    zoom = None
    if query.step_range is not None and not query.by_epoch:
        steps = long_run.steps
        first, last = (int(np.searchsorted(steps, query.step_range[0], "left")),
                       int(np.searchsorted(steps, query.step_range[1], "right")))
        if last - first <= FULL_RESOLUTION_STEPS:
            zoom = long_run.rows(first, last)
    with _digest_of(long_run, query.thresholds) as (digest, progress):
        # Rows of the digest: the steps it holds (a step that did not read back is not one).
        held = digest.steps()
        rows = None
        if query.step_range is not None:
            rows = (int(np.searchsorted(held, query.step_range[0], "left")),
                    int(np.searchsorted(held, query.step_range[1], "right")))
        if zoom is not None and (not len(zoom.steps) or zoom.steps[-1] <= (
                held[-1] if len(held) else -1)):
            positions = np.searchsorted(held, zoom.steps)
            inside = positions < len(held)
            inside[inside] = held[positions[inside]] == zoom.steps[inside]
            zoom = dataclasses.replace(zoom, steps=zoom.steps[inside],
                                       wall_times=zoom.wall_times[inside],
                                       values=zoom.values[inside])
            picked = positions[inside]
            classes = (digest.classes(picked[0], picked[-1] + 1)[picked - picked[0]]
                       if picked.size else np.zeros((0, len(zoom.variables)), np.int8))
            if query.by_layer:
                zoom, classes = _by_layer(zoom, classes)
            matrix = heatmap.build(zoom, query.stat, classes, query.max_steps)
        elif query.by_layer:
            needed = layers.needed_stats(query.stat, long_run.like)
            combined, first, classes = _layer_columns(long_run.like, digest, needed,
                                                      query.max_steps, rows, query.by_epoch)
            matrix = dataclasses.replace(first, values=combined.stat(query.stat).T,
                                         classes=classes.T)
        else:
            matrix, _ = digest.overview(query.stat, query.max_steps, rows, query.by_epoch)
        return matrix, progress


def row_names(variables, layer_of_rows, by_layer: bool) -> list:
    """The names of a tag's rows: its variables, or (``by_layer``) its layers in model order."""
    return layers.Layers.of(layer_of_rows).names if by_layer else list(variables)


def _loaded_by_layer(data: GradientData, loaded: Loaded, classes):
    """`_by_layer` of a loaded short run, its combined series made once while it is current."""
    combined = data.memo(loaded, ("by_layer",), lambda: layers.combined(loaded.series))
    return combined, layers.Layers.of(loaded.series.layers).worst_classes(classes)


def _by_layer(series, classes):
    """(``series`` with one row per layer, each layer's worst class of ``classes``)."""
    return layers.combined(series), layers.Layers.of(series.layers).worst_classes(classes)


def _layer_columns(like, digest, stats, max_steps, rows=None, by_epoch=False):
    """A long run's overview by layer: (its variables' merged columns of ``stats`` combined
    as `layers.combined` combines steps, as a series of one row per layer whose steps are the
    columns; the first stat's `heatmap.Heatmap`, by variable; ``[columns, layers]`` classes)."""
    columns_of = {stat: digest.overview(stat, max_steps, rows, by_epoch)[0] for stat in stats}
    first = columns_of[stats[0]]
    as_steps = dataclasses.replace(
        like, stat_names=tuple(stats), steps=first.steps, wall_times=first.wall_times,
        values=np.stack([columns_of[stat].values.T for stat in stats], axis=-1),
        epoch_starts=None, epoch_indices=None)
    combined, classes = _by_layer(as_steps, first.classes.T)
    return combined, first, classes


def waits(thresholds: analysis.Thresholds) -> bool:
    """Whether an answer waits for a long run's digest to read every step: not under the
    default thresholds, whose digest the background may be feeding (the answer then says how
    far it got); other thresholds are read by the request itself."""
    return thresholds != analysis.Thresholds()


@contextlib.contextmanager
def _digest_of(long_run, thresholds: analysis.Thresholds):
    """Yields a long run's digest under ``thresholds`` as an answer reads it (`waits`), and how
    far it is read: the answer's ``sampled`` (why steps are missing, or None) and
    ``steps_to_read``."""
    with long_run.reading(thresholds, wait=waits(thresholds)) as (digest, unread):
        sampled = None if not unread else (
            f"this long run is still being read from its event files: {digest.rows:,} of its "
            f"{digest.rows + unread:,} logged steps so far (the tab shows the rest as it is read)")
        yield digest, {"sampled": sampled, "steps_to_read": unread}


def _read_whole(loaded: Loaded) -> dict:
    """``sampled`` and ``steps_to_read`` of a run TensorBoard delivers (none left to read)."""
    return {"sampled": loaded.sampled, "steps_to_read": 0}


def alerts_answer(data: GradientData, loaded: Loaded, thresholds: analysis.Thresholds) -> dict:
    """``{"alerts": [Alert, ...], "groups": [AlertGroup, ...]}`` (see `analysis.Alert`,
    `analysis.groups.AlertGroup`: the alerts of one rule over one stretch of steps, whose
    ``alerts`` index the list), both most severe first, with ``sampled``, ``steps_to_read``
    and ``damaged``/``damage`` as in the heatmap."""
    progress = _read_whole(loaded)
    if loaded.long_run is not None:
        with _digest_of(loaded.long_run, thresholds) as (digest, progress):
            found = digest.alerts()
    else:
        found = data.analysis(loaded, thresholds).alerts
    encoded = [
        dict(alert.to_json(), value=encoding.floats(alert.value),
             threshold=encoding.floats(alert.threshold))
        for alert in found
    ]
    series = loaded.series
    grouped = [found_group.to_json()
               for found_group in groups.group(found, series.variables, series.layers)]
    return {"alerts": encoded, "groups": grouped, **progress, **_damage_fields(loaded)}


def series_answer(data: GradientData, loaded: Loaded, row: int,
                  thresholds: analysis.Thresholds, by_layer: bool = False) -> dict:
    """Every stat of the variable of ``row`` (``by_layer``: of the layer of that row in
    model order, combined as in the heatmap's layer rows) over the logged steps, with its
    cell classes.

    A long run (`long_runs`) answers per block of its digest (``downsampled``: each point is a
    block's merged value and worst class, its step the block's first; no step's worst cell is
    hidden); short runs every logged step. ``sampled`` and ``steps_to_read`` as in the
    heatmap."""
    series = loaded.series
    progress = _read_whole(loaded)
    if loaded.long_run is not None:
        with _digest_of(loaded.long_run, thresholds) as (digest, progress):
            if by_layer:
                combined, first, all_classes = _layer_columns(
                    series, digest, series.stat_names, 2**62)
                blocks = {name: combined.stat(name).T for name in combined.available_stats}
                classes = all_classes.T[row]
            else:
                overviews = {stat: digest.overview(stat, 2**62)[0]
                             for stat in series.available_stats}
                first = next(iter(overviews.values()))
                blocks = {stat: overview.values for stat, overview in overviews.items()}
                classes = first.classes[row]
        steps, wall_times = first.steps, first.wall_times
        stats = {name: values[row] for name, values in blocks.items()}
        shown = combined if by_layer else series
    else:
        classes = data.analysis(loaded, thresholds).classes
        shown = series
        if by_layer:
            shown, classes = _loaded_by_layer(data, loaded, classes)
        steps, wall_times = series.steps, series.wall_times
        stats = {name: shown.stat(name)[:, row] for name in shown.available_stats}
        classes = classes[:, row]
    shape = shown.shapes[row]
    return {
        "run": series.run,
        "tag": series.tag,
        "variable": shown.variables[row],
        "variable_index": row,
        "layer": shown.layers[row],
        "shape": None if shape is None else list(shape),
        "steps": steps.tolist(),
        "wall_times": encoding.floats(wall_times),
        "stats": {name: encoding.floats(values) for name, values in stats.items()},
        "classes": encoding.class_names(classes),
        "epochs": _epochs(series),
        "downsampled": loaded.long_run is not None,
        **progress,
    }


def histogram_answer(data: GradientData, ctx, experiment, run: str, tag: str, row: int,
                     step: int, tags=None, by_layer: bool = False) -> dict:
    """One variable's log10|g| histogram at the logged step nearest ``step`` (ties: earlier);
    ``by_layer``: the layer's in model order ``row``, its variables' counts summed.

    ``counts`` follow ``bins`` (labels) and ``log10_edges`` as in `metadata` (exact zeros,
    below/above the edges, NaN and Inf have their own bins). ``row`` is the variable's row in
    the stats tag (the heatmap's), whose rows the histograms share; `UnknownError` when no
    histograms were logged or they are left out (logged for other variables, see
    `reader.histograms_mismatch`). ``tags``: `GradientData.tags` when the caller has it.
    """
    tags = data.tags(ctx, experiment) if tags is None else tags
    layout = data.stats_tag(tags, run, tag).parsed.layout
    histogram = data.histogram_near(ctx, experiment, run, tag, step, tags)
    if by_layer:
        order = layers.Layers.of(layout.layers)
        name = order.names[row]
        members = histogram.counts[order.rows == row]
        with np.errstate(invalid="ignore"):  # NaN rows: variables without a gradient
            counts = np.where(np.isnan(members).all(axis=0), np.nan, np.nansum(members, axis=0))
    else:
        name, counts = layout.variables[row], histogram.counts[row]
    return {
        "run": run,
        "tag": tag,
        "variable": name,
        "variable_index": row,
        "requested_step": step,
        "step": int(histogram.steps[histogram.index]),
        "wall_time": histogram.wall_time,
        "bins": list(histogram.bin_labels),
        "log10_edges": list(histogram.log10_edges),
        "counts": encoding.floats(counts),
        "steps": histogram.steps.tolist(),
    }


def inventory_answer(data: GradientData, ctx, experiment, location: str, local: bool) -> dict:
    """What TensorBoard's logdir holds, for the tab to say when no tag has gradient data (a
    wrong path, or a job that never attached a writer): ``{"location", "exists", "found",
    "entry_points": [{"framework", "entry_point"}]}``, ``found`` in the words of
    `inventory.Inventory.found` (its runs and scalar tags), the entry points
    `inventory.ENTRY_POINTS`. See `GradientData.inventory` for ``local``."""
    found = data.inventory(ctx, experiment, location, local)
    return {
        "location": found.location,
        "exists": found.exists,
        "found": found.found(),
        "entry_points": [{"framework": framework, "entry_point": entry_point}
                         for framework, entry_point in inventory.ENTRY_POINTS],
    }


def thresholds_answer() -> dict:
    """``{"defaults": {name: value}, "vocabulary": ...}``: the overridable thresholds and their
    defaults, and what the tab names and draws (`vocabulary.vocabulary`)."""
    defaults = analysis.Thresholds()
    return {
        "defaults": {n: getattr(defaults, n) for n in analysis.Thresholds.names()},
        "vocabulary": vocabulary.vocabulary(),
    }
