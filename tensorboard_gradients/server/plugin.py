"""The TensorBoard plugin: its entry point and thin HTTP routes (no TensorFlow import).

This module is the `tensorboard_plugins` entry point, so it stays light: TensorBoard imports it
unguarded at start-up and dies if it raises. Each route parses its query (`queries`), loads
its tag's source from the `store` (the plugin's own reader for a local logdir or a bucket,
TensorBoard's data provider otherwise), takes its answer from `answers` (plain data, callable
without HTTP) and responds (`responses`).

Routes (GET, under ``/data/plugin/gradients/``): ``runs``, ``heatmap``, ``alerts``, ``series``,
``histogram``, ``export``, ``thresholds``, ``inventory`` and ``static/<file>``; their parameters,
answers, number encoding and errors are documented once, in ``docs/http-api.md``. Every route
answers plain data from `answers` (callable without HTTP); a bad request is a 400 or 404 as
``{"error": message}``, anything else a bug, logged with its traceback and answered as a JSON
500, never a page.
"""

import mimetypes
import os

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import security

from tensorboard_gradients.format import metadata
from tensorboard_gradients.server import answers, export, responses, store
from tensorboard_gradients.server.queries import BadRequest, Query

# Both loaders otherwise keep only 10 (Python) or 100 (Rust) points per tag for a third-party
# plugin. The plugin reads a local logdir's or a bucket's tags from their event files itself
# (`store`), so TensorBoard need keep one point of each: what tells it that the run has
# gradients. Elsewhere (several logdirs, a scheme whose fsspec filesystem is not installed)
# TensorBoard is the source: 0, every step.
# `--samples_per_plugin gradients=N` overrides both.
LOCAL_SAMPLES = 1
REMOTE_SAMPLES = 0
STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")
_STATIC_PREFIX = "/static/"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".json": "application/json"}


class GradientsPlugin(base_plugin.TBPlugin):
    """Serves the logged gradient statistics under ``/data/plugin/gradients/``."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        # In a real TensorBoard, long runs are digested as it reads the logdir (at its reload
        # interval; 0: once), so their first request answers at once.
        flags = context.flags
        self._store = store.Store(
            context.data_provider, logdir=context.logdir,
            digest_every=None if flags is None else getattr(flags, "reload_interval", 5))
        # What the user gave TensorBoard: one logdir, checked for being a directory when it is a
        # local path, or a --logdir_spec of several (then TensorBoard's context has no logdir).
        spec = getattr(flags, "logdir_spec", "")
        self._location = context.logdir or spec or ""
        self._local_location = bool(context.logdir) and "://" not in context.logdir

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/heatmap": self._serve_heatmap,
            "/alerts": self._serve_alerts,
            "/series": self._serve_series,
            "/histogram": self._serve_histogram,
            "/export": self._serve_export,
            "/thresholds": self._serve_thresholds,
            "/inventory": self._serve_inventory,
            _STATIC_PREFIX + "*": self._serve_static,
        }

    def is_active(self):
        # TensorBoard asks only when its data provider lists none of `data_plugin_names`: then
        # the tab shows if the plugin reads the logdir itself and finds gradients there.
        return self._store.has_own_data()

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(
            es_module_path=_STATIC_PREFIX + "index.js", tab_name="Gradients"
        )

    def _source(self, ctx, experiment, query):
        return self._store.source(ctx, experiment, query.text("run"), query.text("tag"))

    @responses.route
    def _serve_runs(self, request, ctx, experiment):
        Query(request, ())
        return responses.json_response(request, answers.runs_overview(self._store, ctx, experiment))

    @responses.route
    def _serve_heatmap(self, request, ctx, experiment):
        query = Query(
            request,
            ("run", "tag", "stat", "max_steps", "axis", "encoding", "first_step", "last_step",
             "rows"),
            thresholds=True,
        )
        asked = answers.HeatmapQuery(
            stat=query.text("stat"),
            max_steps=query.integer("max_steps", minimum=1, maximum=answers.MAX_COLUMNS),
            step_range=query.step_range(),
            by_epoch=query.choice("axis", ("step", "epoch")) == "epoch",
            packed=query.choice("encoding", ("json", "base64")) == "base64",
            thresholds=query.thresholds(),
            by_layer=_by_layer(query),
        )
        source = self._source(ctx, experiment, query)
        asked = asked.bounded(source)  # the key of the kept answer: equal answers, one copy
        return responses.kept_gzipped_json(
            request, self._store, source, _kept_as(source, ("heatmap", asked), asked.thresholds),
            lambda: answers.heatmap_answer(source, asked),
        )

    @responses.route
    def _serve_thresholds(self, request, ctx, experiment):
        Query(request, ())
        return responses.json_response(request, answers.thresholds_answer())

    @responses.route
    def _serve_inventory(self, request, ctx, experiment):
        Query(request, ())
        return responses.json_response(request, answers.inventory_answer(
            self._store, ctx, experiment, self._location, self._local_location))

    @responses.route
    def _serve_alerts(self, request, ctx, experiment):
        query = Query(request, ("run", "tag"), thresholds=True)
        thresholds = query.thresholds()
        source = self._source(ctx, experiment, query)
        # Kept gzipped like the heatmap: encoding thousands of alerts is most of the answer's cost.
        return responses.kept_gzipped_json(
            request, self._store, source, _kept_as(source, ("alerts", thresholds), thresholds),
            lambda: answers.alerts_answer(source, thresholds),
        )

    @responses.route
    def _serve_series(self, request, ctx, experiment):
        query = Query(request, ("run", "tag", "variable", "variable_index", "rows"),
                      thresholds=True)
        thresholds = query.thresholds()
        by_layer = _by_layer(query)
        source = self._source(ctx, experiment, query)
        like = source.like
        row = query.row(answers.row_names(like.variables, like.layers, by_layer), like.run,
                        like.tag)
        return responses.json_response(
            request, answers.series_answer(source, row, thresholds, by_layer)
        )

    @responses.route
    def _serve_histogram(self, request, ctx, experiment):
        query = Query(request, ("run", "tag", "variable", "variable_index", "step", "rows"))
        step = query.integer("step", minimum=0, required=True)
        by_layer = _by_layer(query)
        source = self._source(ctx, experiment, query)
        like = source.like
        row = query.row(answers.row_names(like.variables, like.layers, by_layer), like.run,
                        like.tag)
        return responses.json_response(
            request, answers.histogram_answer(source, row, step, by_layer))

    @responses.route
    def _serve_export(self, request, ctx, experiment):
        """The whole matrix as CSV (long format, see `export.csv_chunks`), streamed."""
        query = Query(request, ("run", "tag", "format"))
        if query.text("format") != "csv":
            raise BadRequest("parameter 'format' must be csv")
        source = self._source(ctx, experiment, query)
        return responses.csv_download(export.csv_filename(source.like),
                                      export.csv_chunks(source.pieces()))

    @responses.answered
    def _serve_static(self, request):
        """The tab's files from the package's ``static`` folder; nothing outside it."""
        relative = request.path.split(_STATIC_PREFIX, 1)[-1]
        path = security.safe_join(STATIC_DIR, relative)
        if path is None or not os.path.isfile(path):
            return responses.json_response(
                request, {"error": f"no static file {relative!r}"}, code=404
            )
        extension = os.path.splitext(path)[1]
        content_type = _STATIC_TYPES.get(extension) or mimetypes.guess_type(path)[0]
        with open(path, "rb") as handle:
            return http_util.Respond(request, handle.read(), content_type or "text/plain")


def _by_layer(query: Query) -> bool:
    """``rows=layers``: one row per layer (default ``variables``)."""
    return query.choice("rows", ("variables", "layers")) == "layers"


def _kept_as(source, key: tuple, thresholds) -> tuple:
    """The key an answer is kept under: it also says how far the tag's digest has read, so an
    answer given while a long run is still being read is not served once more is read."""
    return key + (source.progress(thresholds),)


class GradientsLoader(base_plugin.TBLoader):
    """Entry point: sets how many steps TensorBoard keeps (see `LOCAL_SAMPLES`) and starts
    scanning the logdir's event files when the plugin reads them itself (`store.prescan`),
    then builds the plugin."""

    def fix_flags(self, flags):
        samples = getattr(flags, "samples_per_plugin", None)
        if samples is not None:
            logdir = getattr(flags, "logdir", None)
            read_here = bool(logdir) and not getattr(flags, "logdir_spec", None) and \
                store.prescan(logdir)
            samples.setdefault(metadata.PLUGIN_NAME,
                               LOCAL_SAMPLES if read_here else REMOTE_SAMPLES)
            # The writer's digests: the plugin reads them from the files itself (a logdir it
            # reads) and never through TensorBoard, which need keep only the latest.
            samples.setdefault(metadata.DIGEST_PLUGIN_NAME, 1)

    def load(self, context):
        return GradientsPlugin(context)
