"""The TensorBoard plugin: HTTP routes over TensorBoard's data provider (no TensorFlow import).

This module is the `tensorboard_plugins` entry point, so it stays light: TensorBoard imports it
unguarded at start-up and dies if it raises.
"""

from tensorboard import context as tb_context
from tensorboard import plugin_util
from tensorboard import errors
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tensorboard_gradients import metadata

# Both loaders otherwise keep only 10 (Python) or 100 (Rust) points per tag for a third-party
# plugin; 0 keeps every logged step. `--samples_per_plugin gradients=N` still caps it.
DEFAULT_SAMPLES = 0
_ALL_POINTS = 10**9


class GradientsPlugin(base_plugin.TBPlugin):
    """Serves the logged gradient statistics under ``/data/plugin/gradients/``."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        self._data_provider = context.data_provider

    def get_plugin_apps(self):
        return {"/runs": self._serve_runs}

    def is_active(self):
        return False  # activity comes from `data_plugin_names` meeting the data provider

    def data_plugin_names(self):
        # The Gradients tab (frontend) is not shipped yet: stay out of the tab bar until it is,
        # while the routes already serve the data.
        return ()

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(tab_name="Gradients")

    @wrappers.Request.application
    def _serve_runs(self, request):
        """``{run: {tag: {"variables", "steps", "stats", "histograms"}}}`` for stats tags."""
        ctx = tb_context.from_environ(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        listing = self._data_provider.list_tensors(
            ctx, experiment_id=experiment, plugin_name=metadata.PLUGIN_NAME
        )
        result = {}
        for run, tags in listing.items():
            for tag, series in tags.items():
                try:
                    parsed = metadata.parse_plugin_data(series.plugin_content)
                except metadata.UnsupportedFormatError as error:
                    raise errors.InvalidArgumentError(f"run {run!r}, tag {tag!r}: {error}")
                if parsed.kind != metadata.KIND_STATS:
                    continue
                result.setdefault(run, {})[tag] = {
                    "variables": len(parsed.layout.variables),
                    "steps": 0,
                    "stats": list(parsed.layout.stats),
                    "histograms": metadata.histogram_tag(tag) in tags,
                }
        if result:
            points = self._data_provider.read_tensors(
                ctx,
                experiment_id=experiment,
                plugin_name=metadata.PLUGIN_NAME,
                downsample=_ALL_POINTS,
                run_tag_filter=provider.RunTagFilter(
                    runs=list(result), tags={t for tags in result.values() for t in tags}
                ),
            )
            for run, tags in result.items():
                for tag, info in tags.items():
                    info["steps"] = len(points.get(run, {}).get(tag, ()))
        return http_util.Respond(request, result, "application/json")


class GradientsLoader(base_plugin.TBLoader):
    """Entry point: keeps every logged step by default, then builds the plugin."""

    def fix_flags(self, flags):
        samples = getattr(flags, "samples_per_plugin", None)
        if samples is not None:
            samples.setdefault(metadata.PLUGIN_NAME, DEFAULT_SAMPLES)

    def load(self, context):
        return GradientsPlugin(context)

