"""What each route answers, as plain data: callable without HTTP (TensorBoard's ``*_impl``).

Each function takes the registry (`store.Store`), the tag's `store.RunSource` where the answer
is about one, and parsed parameters, and returns the JSON-ready dict the route sends: numbers
encoded by `encoding` (non-finite values as strings), before the JSON text and gzip. Every
answer about a tag is built the same way, whatever the run's length or where it is read from:
classes and alerts from the source's digest, an overview from the digest's blocks, and a view
of at most `FULL_RESOLUTION_STEPS` logged steps (a short run whole, or a zoom) from those
steps' rows. Errors are exceptions, which `responses` maps to status codes: `store.UnknownError`
(404), `queries.BadRequest` and `store.UnreadableTagError` (400). The routes (`plugin`) parse
the query, find the source, call these and respond; a test calls them directly.
"""

import dataclasses
from typing import Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import groups, heatmap, layers
from tensorboard_gradients.format import columns, inventory
from tensorboard_gradients.server import encoding, vocabulary
from tensorboard_gradients.server.queries import BadRequest
from tensorboard_gradients.server.store import (
    RunSource, Store, UnknownError, UnreadableTagError,
)

# A heatmap's columns, at most and by default: more than any screen shows. The work and the
# answer scale with columns x variables, so the bound is what keeps one request cheap.
MAX_COLUMNS = 10_000
# A view of at most this many logged steps (a short run, or a zoom into a long one) is read
# back at full resolution (1,000 variables: ~90 MB decoded, well under a second); wider ones
# merge the digest's blocks.
FULL_RESOLUTION_STEPS = 2000
# JSON lists cost about 1 us and 100 bytes of memory per cell to encode (base64 a few ns and 5
# bytes): 10,000 columns of 1,000 variables took 14 s and 650 MB, so a JSON answer merges its
# columns to stay within this many cells.
MAX_JSON_CELLS = 1_000_000


def runs_overview(store: Store, ctx, experiment) -> dict:
    """``{run: {tag: overview}}`` of every stats tag: sizes, stat names and which extras
    (histograms, epochs) exist; ``"not_logged"`` lists the gradient stats its writer left out
    (`GradientSeries.unlogged_stats`), only when it left some out.

    A tag that cannot be read (metadata this version cannot read, data that cannot be decoded)
    is listed with an ``"error"`` message; every other tag is served as usual.
    """
    tags = store.tags(ctx, experiment)
    result = {}
    for run, tag in store.listed_tags(tags):
        result.setdefault(run, {})[tag] = _tag_overview(store, ctx, experiment, run, tag, tags)
    return result


def _tag_overview(store, ctx, experiment, run, tag, tags) -> dict:
    try:
        source = store.source(ctx, experiment, run, tag, tags)
    except UnreadableTagError as error:
        return {"variables": 0, "steps": 0, "stats": [], "histograms": False, "epochs": 0,
                "error": error.reason}
    like = source.like
    overview = {
        "variables": len(like.variables),
        "steps": len(source.steps()),
        "stats": list(like.available_stats),
        "histograms": source.has_histograms,
        "epochs": 0 if like.epoch_starts is None else len(like.epoch_starts),
        "sampled": source.sampled,
    }
    if like.unlogged_stats:  # like "error": only there when there are some
        overview["not_logged"] = list(like.unlogged_stats)
    damage = _damage_fields(source)
    if damage["damaged"] or damage["damage"]:  # like "error": only there when there is some
        overview.update(damage)
    return overview


def _damage_fields(source: RunSource) -> dict:
    damaged, damage = source.damage()
    return {"damaged": damaged, "damage": list(damage)}


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

    def bounded(self, source: RunSource) -> "HeatmapQuery":
        """The same query with ``max_steps`` as answered for this tag (`UnknownError` for a
        stat it does not have, a `BadRequest` naming the logged ones for a gradient stat its
        writer did not log). Idempotent."""
        like = source.like
        if self.stat in like.unlogged_stats:
            # A 400, not a 404: the stat exists, this tag's writer was asked for others.
            raise BadRequest(
                f"stat {self.stat!r} was not logged in run {like.run!r}, tag {like.tag!r}: "
                f"its writer logged only {', '.join(like.stat_names)} (a writer's stats= "
                "chooses the gradient stats)"
            )
        if self.stat not in like.available_stats:
            raise UnknownError(
                f"no stat {self.stat!r} in run {like.run!r}, tag {like.tag!r}; "
                f"have {', '.join(like.available_stats)}"
            )
        max_steps = self.max_steps or MAX_COLUMNS
        if not self.packed:
            max_steps = min(max_steps, max(1, MAX_JSON_CELLS // max(1, len(like.variables))))
        # Any bound at or above the logged steps is the same answer: one kept copy of it.
        max_steps = min(max_steps, max(1, len(source.steps())))
        return dataclasses.replace(self, max_steps=max_steps)


def heatmap_answer(source: RunSource, query: HeatmapQuery) -> dict:
    """The layer x step matrix of one stat, coloured by `analysis.classify`.

    ``values``/``classes`` are ``[variable][column]`` (rows in model order). With more logged
    steps than ``max_steps`` (at most and by default `MAX_COLUMNS`), consecutive steps merge
    into one column by the never-hide-the-worst rule (`heatmap.merge`); ``steps``/
    ``last_steps`` give each column's step range. JSON answers merge to at most
    `MAX_JSON_CELLS` cells (``downsampled`` says so); base64 ones are exactly as asked.
    ``by_epoch`` makes one column per epoch (adds ``epoch_index``; a 400 without epoch marks).
    ``packed`` packs ``values``/``classes`` as typed arrays (`encoding.packed_matrix`).
    ``step_range`` zooms into a step range; cells keep the classes judged on the whole run.
    ``by_layer`` draws one row per layer: its variables combined as one tensor
    (`analysis.layers`), its class their worst; ``variables`` and ``layers`` are then both the
    layer names. A view of at most `FULL_RESOLUTION_STEPS` logged steps combines every step
    exactly; a wider one combines its variables' merged columns (a column's layer norm is then
    the root of summed squares of its variables' merged norms).
    ``sampled`` explains when not every logged step could be delivered (else null);
    ``steps_to_read`` counts the logged steps of a long run the plugin has still to read (the
    tab asks again until it is 0); ``damaged``/``damage`` count and explain logged steps left
    out as damaged.
    """
    query = query.bounded(source)
    like = source.like
    with source.reading(query.thresholds) as (digest, unread):
        try:
            matrix = (_heatmap_of_rows(source, digest, query)
                      or _heatmap_of_blocks(like, digest, query))
        except heatmap.NoEpochsError as error:
            raise BadRequest(str(error)) from None
        progress = _progress(source, digest, unread)
    names = row_names(like.variables, like.layers, query.by_layer)
    payload = {
        "run": like.run,
        "tag": like.tag,
        "stat": query.stat,
        "rows": "layers" if query.by_layer else "variables",
        "variables": list(names),
        "layers": list(names) if query.by_layer else list(like.layers),
        "steps": matrix.steps.tolist(),
        "last_steps": matrix.last_steps.tolist(),
        "wall_times": encoding.floats(matrix.wall_times),
        "epochs": _epochs(like),
        "downsampled": matrix.downsampled or progress["sampled"] is not None,
        **progress,
        **_damage_fields(source),
    }
    if query.packed:
        payload.update(encoding.packed_matrix(matrix.values, matrix.classes))
    else:
        payload.update(values=encoding.floats(matrix.values),
                       classes=encoding.class_names(matrix.classes))
    if query.by_epoch:
        payload["epoch_index"] = matrix.epoch_index.tolist()
    return payload


def _row_range(held: np.ndarray, step_range) -> Tuple[int, int]:
    """The digest rows (positions in ``held``, its steps) inside ``step_range`` (None: all)."""
    if step_range is None:
        return 0, len(held)
    return (int(np.searchsorted(held, step_range[0], "left")),
            int(np.searchsorted(held, step_range[1], "right")))


def _heatmap_of_rows(source, digest, query: HeatmapQuery):
    """The heatmap of a view of at most `FULL_RESOLUTION_STEPS` logged steps, from their
    rows (each step exact, as logged); None for a wider view."""
    first, stop = _row_range(digest.steps(), query.step_range)
    if stop - first > FULL_RESOLUTION_STEPS:
        return None
    rows, classes = _held_rows(source, digest, first, stop)
    rows = dataclasses.replace(rows, epoch_starts=source.like.epoch_starts,
                               epoch_indices=source.like.epoch_indices)
    if query.by_layer:
        rows, classes = _by_layer(rows, classes)
    return heatmap.build(rows, query.stat, classes, query.max_steps, query.by_epoch,
                         query.step_range)


def _heatmap_of_blocks(like, digest, query: HeatmapQuery):
    """The overview of a wide view from the digest's blocks (whole blocks at its ends)."""
    rows = None if query.step_range is None else _row_range(digest.steps(), query.step_range)
    if query.by_layer:
        needed = layers.needed_stats(query.stat, like)
        combined, first, classes = _layer_columns(like, digest, needed, query.max_steps, rows,
                                                  query.by_epoch)
        return dataclasses.replace(first, values=combined.stat(query.stat).T, classes=classes.T)
    return digest.overview(query.stat, query.max_steps, rows, query.by_epoch)[0]


def _held_rows(source, digest, first: int, stop: int):
    """(the rows of digest rows ``first:stop`` read from the source, their classes): the
    steps the digest holds there (a step that did not read back is not one)."""
    held = digest.steps()[first:stop]
    steps = source.steps()
    if not len(held):
        return source.rows(0, 0), np.zeros((0, len(source.like.variables)), np.int8)
    rows = source.rows(int(np.searchsorted(steps, held[0], "left")),
                       int(np.searchsorted(steps, held[-1], "right")))
    positions = np.searchsorted(held, rows.steps)
    inside = positions < len(held)
    inside[inside] = held[positions[inside]] == rows.steps[inside]
    rows = rows.at_rows(inside)
    return rows, digest.classes(first, stop)[positions[inside]]


def row_names(variables, layer_of_rows, by_layer: bool) -> list:
    """The names of a tag's rows: its variables, or (``by_layer``) its layers in model order."""
    return layers.Layers.of(layer_of_rows).names if by_layer else list(variables)


def _by_layer(series, classes):
    """(``series`` with one row per layer, each layer's worst class of ``classes``)."""
    return layers.combined(series), layers.Layers.of(series.layers).worst_classes(classes)


def _layer_columns(like, digest, stats, max_steps, rows=None, by_epoch=False):
    """A wide view by layer: (its variables' merged columns of ``stats`` combined as
    `layers.combined` combines steps, as a series of one row per layer whose steps are the
    columns; the first stat's `heatmap.Heatmap`, by variable; ``[columns, layers]`` classes)."""
    columns_of = {stat: digest.overview(stat, max_steps, rows, by_epoch)[0] for stat in stats}
    first = columns_of[stats[0]]
    as_steps = dataclasses.replace(
        like, stat_names=tuple(stats), steps=first.steps, wall_times=first.wall_times,
        values=np.stack([columns_of[stat].values.T for stat in stats], axis=-1),
        epoch_starts=None, epoch_indices=None)
    combined, classes = _by_layer(as_steps, first.classes.T)
    return combined, first, classes


def _progress(source: RunSource, digest, unread: int) -> dict:
    """An answer's ``sampled`` (why steps are missing, or None) and ``steps_to_read``."""
    sampled = source.sampled
    if unread:
        sampled = (
            f"this long run is still being read from its event files: {digest.rows:,} of its "
            f"{digest.rows + unread:,} logged steps so far (the tab shows the rest as it is read)")
    return {"sampled": sampled, "steps_to_read": unread}


def alerts_answer(source: RunSource, thresholds: analysis.Thresholds) -> dict:
    """``{"alerts": [Alert, ...], "groups": [AlertGroup, ...]}`` (see `analysis.Alert`,
    `analysis.groups.AlertGroup`: the alerts of one rule over one stretch of steps, whose
    ``alerts`` index the list), both most severe first, with ``sampled``, ``steps_to_read``
    and ``damaged``/``damage`` as in the heatmap."""
    with source.reading(thresholds) as (digest, unread):
        found = digest.alerts()
        progress = _progress(source, digest, unread)
    encoded = [
        dict(alert.to_json(), value=encoding.floats(alert.value),
             threshold=encoding.floats(alert.threshold))
        for alert in found
    ]
    like = source.like
    grouped = [found_group.to_json()
               for found_group in groups.group(found, like.variables, like.layers)]
    return {"alerts": encoded, "groups": grouped, **progress, **_damage_fields(source)}


def series_answer(source: RunSource, row: int, thresholds: analysis.Thresholds,
                  by_layer: bool = False) -> dict:
    """Every stat of the variable of ``row`` (``by_layer``: of the layer of that row in
    model order, combined as in the heatmap's layer rows) over the logged steps, with its
    cell classes. ``full``: per step, whether it holds every stat (False at the norms-only
    steps of format 1.6, `GradientSeries.full_rows`; a block always does); ``every_step``:
    the stats held at the norms-only steps too (`GradientSeries.logged_rows`); ``stats_every``:
    every stat is logged at least every this many logged steps.

    A run of at most `FULL_RESOLUTION_STEPS` logged steps answers every step; a longer one
    per block of its digest (``downsampled``: each point is a block's merged value and worst
    class, its step the block's first; no step's worst cell is hidden). ``sampled`` and
    ``steps_to_read`` as in the heatmap."""
    like = source.like
    with source.reading(thresholds) as (digest, unread):
        downsampled = digest.rows > FULL_RESOLUTION_STEPS
        if not downsampled:
            shown, classes = _held_rows(source, digest, 0, digest.rows)
            if by_layer:
                shown, classes = _by_layer(shown, classes)
            steps, wall_times, full = shown.steps, shown.wall_times, shown.full_rows
            stats = {name: shown.stat(name)[:, row] for name in shown.available_stats}
            classes = classes[:, row]
        elif by_layer:
            shown, first, all_classes = _layer_columns(like, digest, like.stat_names, 2**62)
            steps, wall_times, classes = first.steps, first.wall_times, all_classes.T[row]
            stats = {name: shown.stat(name).T[row] for name in shown.available_stats}
            full = np.ones(len(steps), dtype=bool)
        else:
            overviews = {stat: digest.overview(stat, 2**62)[0] for stat in like.available_stats}
            first = next(iter(overviews.values()))
            shown, steps, wall_times, classes = like, first.steps, first.wall_times, \
                first.classes[row]
            stats = {stat: overview.values[row] for stat, overview in overviews.items()}
            full = np.ones(len(steps), dtype=bool)
        progress = _progress(source, digest, unread)
    shape = shown.shapes[row]
    return {
        "run": like.run,
        "tag": like.tag,
        "variable": shown.variables[row],
        "variable_index": row,
        "layer": shown.layers[row],
        "shape": None if shape is None else list(shape),
        "steps": steps.tolist(),
        "wall_times": encoding.floats(wall_times),
        "stats": {name: encoding.floats(values) for name, values in stats.items()},
        "classes": encoding.class_names(classes),
        "full": full.tolist(),
        "every_step": [name for name in stats if columns.logged_every_step(name, like.every_step)],
        "stats_every": like.stats_every,
        "epochs": _epochs(like),
        "downsampled": downsampled,
        **progress,
    }


def histogram_answer(source: RunSource, row: int, step: int, by_layer: bool = False) -> dict:
    """One variable's log10|g| histogram at the logged step nearest ``step`` (ties: earlier);
    ``by_layer``: the layer's in model order ``row``, its variables' counts summed.

    ``counts`` follow ``bins`` (labels) and ``log10_edges`` as in `metadata` (exact zeros,
    below/above the edges, NaN and Inf have their own bins). ``row`` is the variable's row in
    the stats tag (the heatmap's), whose rows the histograms share; `UnknownError` when no
    histograms were logged or they are left out (logged for other variables, see
    `reader.histograms_mismatch`).
    """
    like = source.like
    histogram = source.histogram_near(step)
    if by_layer:
        order = layers.Layers.of(like.layers)
        name = order.names[row]
        members = histogram.counts[order.rows == row]
        with np.errstate(invalid="ignore"):  # NaN rows: variables without a gradient
            counts = np.where(np.isnan(members).all(axis=0), np.nan, np.nansum(members, axis=0))
    else:
        name, counts = like.variables[row], histogram.counts[row]
    return {
        "run": like.run,
        "tag": like.tag,
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


def inventory_answer(store: Store, ctx, experiment, location: str, local: bool) -> dict:
    """What TensorBoard's logdir holds, for the tab to say when no tag has gradient data (a
    wrong path, or a job that never attached a writer): ``{"location", "exists", "found",
    "entry_points": [{"framework", "entry_point"}]}``, ``found`` in the words of
    `inventory.Inventory.found` (its runs and scalar tags), the entry points
    `inventory.ENTRY_POINTS`. See `store.Store.inventory` for ``local``."""
    found = store.inventory(ctx, experiment, location, local)
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
