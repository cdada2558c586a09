"""HTTP answers of the plugin's routes: JSON, gzipped JSON kept per series, CSV downloads, and
errors mapped to status codes.

Errors: a missing or invalid parameter (`queries.BadRequest`) or a tag that cannot be read
(`store.UnreadableTagError`) answers 400, an unknown run, tag, variable or stat
(`store.UnknownError`) 404, both as ``{"error": message}``: only these deliberate errors. The
other exceptions, a ``ValueError`` of numpy's included, are bugs: logged with their traceback
and answered as a JSON 500, never a page. TensorBoard's own public errors pass through.
"""

import functools
import logging

from tensorboard import context as tb_context
from tensorboard import errors as tb_errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from werkzeug import wrappers

from tensorboard_gradients.server import encoding, store
from tensorboard_gradients.server.queries import BadRequest

logger = logging.getLogger(__name__)


def json_response(request, payload, code=200):
    return http_util.Respond(request, encoding.json_text(payload), "application/json", code=code)


def kept_gzipped_json(request, kept, source, key, build):
    """``build()`` as gzipped JSON, kept for as long as ``source`` is current
    (`store.Store.memo` of ``kept`` under ``key``): a repeated request (the tab polling a
    finished run) costs no encoding; `Respond` unzips on the fly for a client that does not
    accept gzip."""
    body = kept.memo(source, key, lambda: encoding.gzipped_json(build()))
    return http_util.Respond(request, body, "application/json", content_encoding="gzip")


def csv_download(filename, chunks):
    """A streamed CSV attachment of text ``chunks``."""
    return wrappers.Response(
        (chunk.encode("utf-8") for chunk in chunks),
        mimetype="text/csv",
        headers={
            "Content-Disposition": f'attachment; filename="{filename}"',
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )


def answered(handler):
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
            return json_response(request, {"error": (
                f"internal error of the Gradients plugin ({type(error).__name__}); "
                "TensorBoard's log has the details"
            )}, code=500)

    return application


def route(handler):
    """Runs a handler with the request's context; maps bad input and unreadable tags to 400 and
    unknown names to 404 (anything else: `answered`)."""

    @functools.wraps(handler)
    @answered
    def application(self, request):
        ctx = tb_context.from_environ(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        try:
            with store.answering():  # long runs read in the background wait
                return handler(self, request, ctx, experiment)
        except store.UnknownError as error:
            return json_response(request, {"error": str(error)}, code=404)
        except (BadRequest, store.UnreadableTagError) as error:
            return json_response(request, {"error": str(error)}, code=400)

    return application
