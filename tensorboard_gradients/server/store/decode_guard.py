"""Logged tensors checked against their tag's metadata BEFORE TensorBoard decodes them.

Both data providers decode inside ``read_tensors`` with `tensor_util.make_ndarray`, which expands
a one-value ("splat") tensor to whatever shape it declares: a 537-byte record declaring a
[1048576, 1048576] float32 tensor asks for 4.4 TB, so every read of its tag would fail (and a
smaller bomb would hold gigabytes of server memory). No provider API hands out the undecoded
proto, and both providers (the Python loader's ``backend/event_processing/data_provider.py``,
the Rust loader's ``data/grpc_provider.py``) call ``tensor_util.make_ndarray`` through the
module attribute at call time, on the thread that called ``read_tensors``. That attribute is
therefore the one hook before decoding: `install_decode_guard` replaces it, once per process,
by a function that IS the original except on a thread inside a `decoding_as` block (the
plugin's own ``read_tensors`` calls, `provider`), where it decodes with
`series.decode_tensor` against the shape the metadata gives and turns a refused tensor into
None, which `series.series_from_points` counts as a damaged point.
"""

import collections
import contextlib
import functools
import threading
from typing import Optional, Tuple

from tensorboard.util import tensor_util

from tensorboard_gradients.format.series import DamagedPointError, decode_tensor


class _DecodeExpectation(threading.local):
    shape: Optional[Tuple[int, ...]] = None  # set while this thread reads one of our tags
    refusals: Optional[collections.Counter] = None  # why tensors were refused, by reason


_EXPECTATION = _DecodeExpectation()
_INSTALL_LOCK = threading.Lock()


def _guarded(original):
    @functools.wraps(original)
    def make_ndarray(tensor):
        shape = _EXPECTATION.shape
        if shape is None:
            return original(tensor)
        try:
            return decode_tensor(tensor, shape)
        except DamagedPointError as error:
            _EXPECTATION.refusals[str(error)] += 1
            return None

    make_ndarray.gradients_decode_guard = True
    return make_ndarray


def install_decode_guard():
    """Makes `tensor_util.make_ndarray` check our tags' tensors before decoding (idempotent)."""
    with _INSTALL_LOCK:
        if not getattr(tensor_util.make_ndarray, "gradients_decode_guard", False):
            tensor_util.make_ndarray = _guarded(tensor_util.make_ndarray)


@contextlib.contextmanager
def decoding_as(shape: Tuple[int, ...], refusals: collections.Counter):
    """On this thread, tensors decode checked against ``shape``; each refusal is counted in
    ``refusals`` by its reason."""
    _EXPECTATION.shape, _EXPECTATION.refusals = shape, refusals
    try:
        yield
    finally:
        _EXPECTATION.shape = _EXPECTATION.refusals = None
