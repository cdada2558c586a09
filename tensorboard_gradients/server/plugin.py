"""The TensorBoard plugin: HTTP routes only (no TensorFlow import).

This module is the `tensorboard_plugins` entry point, so it stays light: TensorBoard imports it
unguarded at start-up and dies if it raises. Data comes from `data_access` (TensorBoard's data
provider, both loaders), rules from `analysis`, the merged matrix from `heatmap`.

Routes (GET, under ``/data/plugin/gradients/``):

* ``runs`` -> ``{run: {tag: {"variables", "steps", "stats", "histograms", "epochs", "sampled"}}}``
  (stats: the logged ones, then the derived ratios `columns.DERIVED_STATS` that can be computed;
  epochs: how many epoch marks, 0 without; sampled: null or why not every step is served). A tag
  that cannot be read is listed with ``"error"``; a tag with logged steps left out as damaged
  adds ``"damaged"`` (how many) and ``"damage"`` (sentences saying why, also naming damaged
  event files of the run and what its histograms and epoch marks lost, e.g. histograms left out
  because they were logged for other variables: `reader.histograms_mismatch`).
* ``heatmap?run&tag&stat[&max_steps][&axis=step|epoch][&encoding=json|base64][&first_step]
  [&last_step][&<threshold>...]`` -> the matrix (see `_serve_heatmap`), ``"damaged"`` and
  ``"damage"`` (0 and [] when nothing was left out). ``max_steps``: at most `MAX_COLUMNS`
  columns, also the default; a JSON-encoded answer merges further to keep within
  `MAX_JSON_CELLS` cells.
* ``alerts?run&tag[&<threshold>=<value>...]`` -> ``{"alerts": [...], "sampled", "damaged",
  "damage"}``
* ``series?run&tag&(variable|variable_index)[&<threshold>...]`` -> every stat of one variable
  over the steps
* ``histogram?run&tag&(variable|variable_index)&step`` -> the distribution at the nearest logged
  step
* ``export?run&tag&format=csv`` -> the whole matrix as a CSV download
* ``thresholds`` -> ``{"defaults": {name: value}}`` (the overridable rule parameters)
* ``static/<file>`` -> the Gradients tab's ES modules

A variable is named by ``variable`` (its name) or ``variable_index`` (its row in the heatmap,
0-based): exactly one of them. The tab sends the index, so a very long name never makes a URL
longer than the HTTP server accepts.

JSON encoding of numbers: finite floats are JSON numbers; NaN, +Inf and -Inf are the STRINGS
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (TensorBoard's own convention, `json_util.Cleanse`),
so exploding gradients survive the trip. A missing gradient is ``"NaN"`` with class ``"missing"``.
Threshold overrides are the field names of `analysis.Thresholds` (e.g. ``&exploding_norm=100``).

Errors: a missing or invalid parameter answers 400 (integers must fit in int64), a tag that
cannot be read 400, an unknown run, tag, variable or stat 404, all as ``{"error": message}``.
Anything else is a bug: logged with its traceback and answered as a JSON 500, never a page.
"""

import base64
import functools
import gzip
import json
import logging
import mimetypes
import os
import re

import numpy as np
from tensorboard import context as tb_context
from tensorboard import errors as tb_errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import security, wrappers

from tensorboard_gradients import analysis
from tensorboard_gradients.format import metadata
from tensorboard_gradients.server import data_access, export, heatmap

logger = logging.getLogger(__name__)

# Both loaders otherwise keep only 10 (Python) or 100 (Rust) points per tag for a third-party
# plugin; 0 keeps every logged step. `--samples_per_plugin gradients=N` still caps it.
DEFAULT_SAMPLES = 0
STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
_STATIC_PREFIX = "/static/"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".json": "application/json"}
# Event steps are int64; a larger query integer could only overflow the arithmetic on them.
_INT64_MAX = 2**63 - 1
# A heatmap's columns, at most and by default: more than any screen shows. The work and the
# answer scale with columns x variables, so the bound is what keeps one request cheap.
MAX_COLUMNS = 10_000
# JSON lists cost about 1 us and 100 bytes of memory per cell to encode (base64 a few ns and 5
# bytes): 10,000 columns of 1,000 variables took 14 s and 650 MB, so a JSON answer merges its
# columns to stay within this many cells.
MAX_JSON_CELLS = 1_000_000


class _BadRequest(ValueError):
    pass


def _floats(values):
    """Nested lists of a float array, non-finite values as TensorBoard's strings."""
    array = np.asarray(values, dtype=np.float64)
    if np.isfinite(array).all():
        return array.tolist()
    encoded = array.astype(object)
    encoded[np.isnan(array)] = "NaN"
    encoded[array == np.inf] = "Infinity"
    encoded[array == -np.inf] = "-Infinity"
    return encoded.tolist()


def _packed_matrix(matrix: heatmap.Heatmap):
    """``encoding=base64``: the matrix as typed arrays, ~10x smaller and faster than JSON lists.

    ``values``: base64 of little-endian float32, row-major ``[variables][columns]`` (NaN and
    Inf are native float32 values); ``classes``: base64 of uint8 codes indexing
    ``class_names``.
    """
    return {
        "encoding": "base64",
        "shape": list(matrix.values.shape),
        "values": base64.b64encode(matrix.values.astype("<f4").tobytes()).decode("ascii"),
        "classes": base64.b64encode(matrix.classes.astype(np.uint8).tobytes()).decode("ascii"),
        "class_names": list(analysis.CLASSES),
    }


def _class_names(codes):
    return np.asarray(analysis.CLASSES, dtype=object)[codes].tolist()


def _json_text(payload) -> str:
    # Arrays were encoded by `_floats`; `allow_nan=False` proves no bare NaN slipped through.
    return json.dumps(payload, allow_nan=False)


def _respond_json(request, payload, code=200):
    return http_util.Respond(request, _json_text(payload), "application/json", code=code)


class _Query:
    """The query string of one request, validated (400 on anything unexpected)."""

    def __init__(self, request, names, thresholds=False):
        self._args = request.args
        allowed = set(names) | (set(analysis.Thresholds.names()) if thresholds else set())
        for name in self._args:
            if name not in allowed:
                raise _BadRequest(
                    f"unknown parameter {name!r}; this route takes {', '.join(sorted(allowed))}"
                )
            if len(self._args.getlist(name)) > 1:
                raise _BadRequest(f"parameter {name!r} was given more than once")

    def __contains__(self, name):
        return name in self._args

    def text(self, name):
        value = self._args.get(name)
        if value is None or value == "":
            raise _BadRequest(f"missing parameter {name!r}")
        return value

    def integer(self, name, minimum, maximum=_INT64_MAX, required=False):
        if name not in self._args and not required:
            return None
        text = self.text(name)
        try:
            value = int(text)
        except ValueError:
            raise _BadRequest(f"parameter {name!r} must be an integer, got {text[:40]!r}") from None
        if not minimum <= value <= maximum:
            raise _BadRequest(
                f"parameter {name!r} must be an integer from {minimum} to {maximum}, "
                f"got {text[:40]}{'...' if len(text) > 40 else ''}"
            )
        return value

    def choice(self, name, options):
        value = self._args.get(name, options[0])
        if value not in options:
            raise _BadRequest(f"parameter {name!r} must be one of {', '.join(options)}")
        return value

    def thresholds(self) -> analysis.Thresholds:
        given = {n: self._args[n] for n in analysis.Thresholds.names() if n in self._args}
        return analysis.Thresholds.from_strings(given)


def _answered(handler):
    """The last resort around every handler: an unexpected exception is logged with its
    traceback and answered as JSON, so the tab shows a message instead of an HTML page."""

    @functools.wraps(handler)
    @wrappers.Request.application
    def application(self, request):
        try:
            return handler(self, request)
        except tb_errors.PublicError:
            raise  # TensorBoard answers its own errors (4xx with their message)
        except Exception as error:  # noqa: BLE001 - see above
            logger.exception("gradients plugin: %s failed", request.full_path)
            return _respond_json(request, {"error": (
                f"internal error of the Gradients plugin ({type(error).__name__}); "
                "TensorBoard's log has the details"
            )}, code=500)

    return application


def _route(handler):
    """Runs a handler with the request's context; maps bad input and unreadable tags to 400 and
    unknown names to 404."""

    @functools.wraps(handler)
    @_answered
    def application(self, request):
        ctx = tb_context.from_environ(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        try:
            return handler(self, request, ctx, experiment)
        except data_access.UnknownError as error:
            return _respond_json(request, {"error": str(error)}, code=404)
        except ValueError as error:  # _BadRequest, thresholds, unreadable tag, no epochs
            return _respond_json(request, {"error": str(error)}, code=400)

    return application


def _requested_row(query, variables, run, tag) -> int:
    """The row a request names by ``variable`` or ``variable_index`` (exactly one of them)."""
    if ("variable" in query) == ("variable_index" in query):
        raise _BadRequest("give exactly one of the parameters 'variable' and 'variable_index'")
    if "variable_index" in query:
        index = query.integer("variable_index", minimum=0, required=True)
        if index >= len(variables):
            raise data_access.UnknownError(
                f"no variable index {index} in run {run!r}, tag {tag!r} "
                f"({len(variables)} variables)"
            )
        return index
    return _variable_row(variables, query.text("variable"), run, tag)


def _variable_row(variables, variable, run, tag) -> int:
    try:
        return variables.index(variable)
    except ValueError:
        raise data_access.UnknownError(
            f"no variable {variable!r} in run {run!r}, tag {tag!r}"
        ) from None


def _nearest_index(steps: np.ndarray, step: int) -> int:
    """The index of the logged step nearest ``step`` in sorted ``steps`` (ties: the earlier),
    in Python integers: int64 arithmetic would overflow for steps far apart."""
    after = int(np.searchsorted(steps, step))
    candidates = [i for i in (after - 1, after) if 0 <= i < len(steps)]
    return min(candidates, key=lambda i: (abs(int(steps[i]) - step), i))


def _gzipped_json(payload) -> bytes:
    # Level 1: 3x faster than TensorBoard's level 3 on these answers for 5% more bytes.
    return gzip.compress(_json_text(payload).encode(), compresslevel=1, mtime=0)


def _damage_fields(loaded: data_access.Loaded):
    return {"damaged": loaded.damaged, "damage": list(loaded.damage)}


class GradientsPlugin(base_plugin.TBPlugin):
    """Serves the logged gradient statistics under ``/data/plugin/gradients/``."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data = data_access.GradientData(context.data_provider, logdir=context.logdir)

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/heatmap": self._serve_heatmap,
            "/alerts": self._serve_alerts,
            "/series": self._serve_series,
            "/histogram": self._serve_histogram,
            "/export": self._serve_export,
            "/thresholds": self._serve_thresholds,
            _STATIC_PREFIX + "*": self._serve_static,
        }

    def is_active(self):
        return False  # activity comes from `data_plugin_names` meeting the data provider

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(
            es_module_path=_STATIC_PREFIX + "index.js", tab_name="Gradients"
        )

    @_route
    def _serve_runs(self, request, ctx, experiment):
        """Every stats tag: sizes, stat names and which extras (histograms, epochs) exist.

        A tag that cannot be read (metadata this version cannot read, data that cannot be
        decoded) is listed with an ``"error"`` message; every other tag is served as usual.
        """
        _Query(request, ())
        tags = self._data.tags(ctx, experiment)
        result = {}
        for run, tag in self._data.listed_tags(tags):
            result.setdefault(run, {})[tag] = self._tag_overview(ctx, experiment, run, tag, tags)
        return _respond_json(request, result)

    def _tag_overview(self, ctx, experiment, run, tag, tags):
        try:
            loaded = self._data.series(ctx, experiment, run, tag, tags)
        except data_access.UnreadableTagError as error:
            return {"variables": 0, "steps": 0, "stats": [], "histograms": False, "epochs": 0,
                    "error": error.reason}
        series = loaded.series
        overview = {
            "variables": len(series.variables),
            "steps": len(series.steps),
            "stats": list(series.available_stats),
            "histograms": self._data.has_histograms(tags, run, tag),
            "epochs": 0 if series.epoch_starts is None else len(series.epoch_starts),
            "sampled": loaded.sampled,
        }
        if loaded.damaged or loaded.damage:  # like "error": only there when there is some
            overview.update(_damage_fields(loaded))
        return overview

    def _load(self, ctx, experiment, query):
        return self._data.series(ctx, experiment, query.text("run"), query.text("tag"))

    @_route
    def _serve_heatmap(self, request, ctx, experiment):
        """The layer x step matrix of one stat, coloured by `analysis.classify`.

        ``values``/``classes`` are ``[variable][column]`` (rows in model order). With more logged
        steps than ``max_steps`` (at most and by default `MAX_COLUMNS`), consecutive steps merge
        into one column by the never-hide-the-worst rule (`heatmap.merge`); ``steps``/
        ``last_steps`` give each column's step range. JSON answers merge to at most
        `MAX_JSON_CELLS` cells (``downsampled`` says so); base64 ones are exactly as asked.
        ``axis=epoch`` makes one column per epoch (adds ``epoch_index``; 400 without epoch marks).
        ``encoding=base64`` packs ``values``/``classes`` as typed arrays (`_packed_matrix`).
        ``first_step``/``last_step`` (inclusive) zoom into a step range; cells keep the classes
        judged on the whole run.
        ``sampled`` explains when TensorBoard could not deliver every logged step (else null);
        ``damaged``/``damage`` count and explain logged steps left out as damaged.
        """
        query = _Query(
            request,
            ("run", "tag", "stat", "max_steps", "axis", "encoding", "first_step", "last_step"),
            thresholds=True,
        )
        stat = query.text("stat")
        max_steps = query.integer("max_steps", minimum=1, maximum=MAX_COLUMNS) or MAX_COLUMNS
        first_step = query.integer("first_step", minimum=0)
        last_step = query.integer("last_step", minimum=0)
        step_range = None
        if first_step is not None or last_step is not None:
            step_range = (first_step or 0, _INT64_MAX if last_step is None else last_step)
            if step_range[0] > step_range[1]:
                raise _BadRequest("parameter 'first_step' must not exceed 'last_step'")
        by_epoch = query.choice("axis", ("step", "epoch")) == "epoch"
        packed = query.choice("encoding", ("json", "base64")) == "base64"
        thresholds = query.thresholds()
        loaded = self._load(ctx, experiment, query)
        series = loaded.series
        if stat not in series.available_stats:
            raise data_access.UnknownError(
                f"no stat {stat!r} in run {series.run!r}, tag {series.tag!r}; "
                f"have {', '.join(series.available_stats)}"
            )
        if not packed:
            max_steps = min(max_steps, max(1, MAX_JSON_CELLS // max(1, len(series.variables))))
        # Any bound at or above the logged steps is the same answer: one kept copy of it.
        max_steps = min(max_steps, max(1, len(series.steps)))
        # Kept gzipped: a repeated request (the tab polling a finished run) costs no encoding;
        # `Respond` unzips on the fly for a client that does not accept gzip.
        body = self._data.memo(
            loaded,
            ("heatmap", stat, max_steps, by_epoch, packed, step_range, thresholds),
            lambda: _gzipped_json(
                self._heatmap_payload(
                    loaded, stat, max_steps, by_epoch, packed, step_range, thresholds
                )
            ),
        )
        return http_util.Respond(request, body, "application/json", content_encoding="gzip")

    def _heatmap_payload(self, loaded, stat, max_steps, by_epoch, packed, step_range, thresholds):
        series = loaded.series
        classes = self._data.analysis(loaded, thresholds).classes
        matrix = heatmap.build(series, stat, classes, max_steps, by_epoch, step_range)
        payload = {
            "run": series.run,
            "tag": series.tag,
            "stat": stat,
            "variables": list(series.variables),
            "layers": list(series.layers),
            "steps": matrix.steps.tolist(),
            "last_steps": matrix.last_steps.tolist(),
            "wall_times": _floats(matrix.wall_times),
            "epochs": None if series.epoch_starts is None else series.epoch_starts.tolist(),
            "downsampled": matrix.downsampled or loaded.sampled is not None,
            "sampled": loaded.sampled,
            **_damage_fields(loaded),
        }
        if packed:
            payload.update(_packed_matrix(matrix))
        else:
            payload.update(values=_floats(matrix.values), classes=_class_names(matrix.classes))
        if by_epoch:
            payload["epoch_index"] = matrix.epoch_index.tolist()
        return payload

    @_route
    def _serve_thresholds(self, request, ctx, experiment):
        """``{"defaults": {name: value}}``: the overridable thresholds and their defaults."""
        _Query(request, ())
        defaults = analysis.Thresholds()
        return _respond_json(
            request, {"defaults": {n: getattr(defaults, n) for n in analysis.Thresholds.names()}}
        )

    @_route
    def _serve_alerts(self, request, ctx, experiment):
        """``{"alerts": [Alert, ...]}`` (see `analysis.Alert`), most severe first, with
        ``sampled`` and ``damaged``/``damage`` as in the heatmap."""
        query = _Query(request, ("run", "tag"), thresholds=True)
        thresholds = query.thresholds()
        loaded = self._load(ctx, experiment, query)

        def payload():
            encoded = [
                dict(alert.to_json(), value=_floats(alert.value),
                     threshold=_floats(alert.threshold))
                for alert in self._data.analysis(loaded, thresholds).alerts
            ]
            return {"alerts": encoded, "sampled": loaded.sampled, **_damage_fields(loaded)}

        # Kept gzipped like the heatmap: encoding thousands of alerts is most of the answer's cost.
        body = self._data.memo(loaded, ("alerts", thresholds), lambda: _gzipped_json(payload()))
        return http_util.Respond(request, body, "application/json", content_encoding="gzip")

    @_route
    def _serve_series(self, request, ctx, experiment):
        """Every stat of one variable over the logged steps, with its cell classes."""
        query = _Query(request, ("run", "tag", "variable", "variable_index"), thresholds=True)
        thresholds = query.thresholds()
        loaded = self._load(ctx, experiment, query)
        series = loaded.series
        row = _requested_row(query, series.variables, series.run, series.tag)
        shape = series.shapes[row]
        return _respond_json(
            request,
            {
                "run": series.run,
                "tag": series.tag,
                "variable": series.variables[row],
                "variable_index": row,
                "layer": series.layers[row],
                "shape": None if shape is None else list(shape),
                "steps": series.steps.tolist(),
                "wall_times": _floats(series.wall_times),
                "stats": {
                    name: _floats(series.stat(name)[:, row]) for name in series.available_stats
                },
                "classes": _class_names(self._data.analysis(loaded, thresholds).classes[:, row]),
                "epochs": None if series.epoch_starts is None else series.epoch_starts.tolist(),
            },
        )

    @_route
    def _serve_histogram(self, request, ctx, experiment):
        """One variable's log10|g| histogram at the logged step nearest ``step`` (ties: earlier).

        ``counts`` follow ``bins`` (labels) and ``log10_edges`` as in `metadata` (exact zeros,
        below/above the edges, NaN and Inf have their own bins). ``variable_index`` is the row of
        the stats tag (the heatmap's), whose rows the histograms share; 404 when no histograms
        were logged or they are left out (logged for other variables, see
        `reader.histograms_mismatch`).
        """
        query = _Query(request, ("run", "tag", "variable", "variable_index", "step"))
        step = query.integer("step", minimum=0, required=True)
        run, tag = query.text("run"), query.text("tag")
        tags = self._data.tags(ctx, experiment)
        layout = self._data.stats_tag(tags, run, tag).parsed.layout
        row = _requested_row(query, layout.variables, run, tag)
        histograms = self._data.histograms(ctx, experiment, run, tag, tags)
        index = _nearest_index(histograms.steps, step)
        return _respond_json(
            request,
            {
                "run": run,
                "tag": tag,
                "variable": layout.variables[row],
                "variable_index": row,
                "requested_step": step,
                "step": int(histograms.steps[index]),
                "wall_time": float(histograms.wall_times[index]),
                "bins": list(histograms.bin_labels),
                "log10_edges": list(histograms.log10_edges),
                "counts": _floats(histograms.counts[index, row]),
                "steps": histograms.steps.tolist(),
            },
        )

    @_route
    def _serve_export(self, request, ctx, experiment):
        """The whole matrix as CSV (long format, see `export.csv_chunks`), streamed."""
        query = _Query(request, ("run", "tag", "format"))
        if query.text("format") != "csv":
            raise _BadRequest("parameter 'format' must be csv")
        series = self._load(ctx, experiment, query).series
        filename = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{series.run}_{series.tag}") + ".csv"
        response = wrappers.Response(
            (chunk.encode("utf-8") for chunk in export.csv_chunks(series)),
            mimetype="text/csv",
            headers={
                "Content-Disposition": f'attachment; filename="{filename}"',
                "X-Content-Type-Options": "nosniff",
                "Cache-Control": "no-cache",
            },
        )
        return response

    @_answered
    def _serve_static(self, request):
        """The tab's files from the package's ``static`` folder; nothing outside it."""
        relative = request.path.split(_STATIC_PREFIX, 1)[-1]
        path = security.safe_join(STATIC_DIR, relative)
        if path is None or not os.path.isfile(path):
            return _respond_json(request, {"error": f"no static file {relative!r}"}, code=404)
        extension = os.path.splitext(path)[1]
        content_type = _STATIC_TYPES.get(extension) or mimetypes.guess_type(path)[0]
        with open(path, "rb") as handle:
            return http_util.Respond(request, handle.read(), content_type or "text/plain")


class GradientsLoader(base_plugin.TBLoader):
    """Entry point: keeps every logged step by default, then builds the plugin."""

    def fix_flags(self, flags):
        samples = getattr(flags, "samples_per_plugin", None)
        if samples is not None:
            samples.setdefault(metadata.PLUGIN_NAME, DEFAULT_SAMPLES)

    def load(self, context):
        return GradientsPlugin(context)
