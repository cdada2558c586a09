"""What a `GradientWriter` takes, checked, and the arrays it writes as `TensorProto`s: the
conversions done per logged step, kept apart from the writing."""

from typing import Optional

import numpy as np
from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.util import tensor_util

from tensorboard_gradients.format import columns

# The float arrays written at every logged step, with the TensorProto fields holding their values.
FLOAT_TENSORS = {np.dtype(np.float32): (types_pb2.DT_FLOAT, "float_val"),
                  np.dtype(np.float64): (types_pb2.DT_DOUBLE, "double_val")}


def float_array(value) -> Optional[np.ndarray]:
    """``value`` as an array when it is a float32 or float64 numpy array or scalar (what the
    writer builds its float tensors from), else None: other values go to TensorBoard's
    converter as given (``np.asarray`` would cut a digest's bytes at their trailing NULs)."""
    return np.asarray(value) if getattr(value, "dtype", None) in FLOAT_TENSORS else None


def tensor_proto(value) -> tensor_pb2.TensorProto:
    """``tensor_util.make_tensor_proto(value)``, the same message, built directly for float32
    and float64 arrays (`float_array`): the writer's thread builds several per logged step, and
    TensorBoard's general converter (dtype and shape inference) took a third of that thread's
    time per step. Values in ``tensor_content`` (native byte order, as TensorBoard writes them)
    unless there is a single one (``float_val`` / ``double_val``); other values go through it."""
    array = float_array(value)
    if array is None:
        return tensor_util.make_tensor_proto(value)
    kind = FLOAT_TENSORS[array.dtype]
    proto = tensor_pb2.TensorProto(dtype=kind[0], tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=n) for n in array.shape]))
    if array.size > 1:
        proto.tensor_content = array.tobytes()
    elif array.size == 1:
        getattr(proto, kind[1]).append(array.item())
    return proto


def loss_value(loss) -> Optional[float]:
    """``loss`` as a float (None stays None): a Python or numpy number, or a one-element array or
    tensor (a framework's scalar tensor converts through ``__float__``)."""
    if loss is None:
        return None
    try:
        return float(loss)
    except (TypeError, ValueError):
        raise ValueError(f"loss must be a number or a one-element tensor, got "
                         f"{type(loss).__name__}") from None


def check_stats_shape(layout, stats):
    expected = (len(layout.variables), len(layout.stats))
    if np.shape(stats) != expected:
        raise ValueError(f"stats matrix has shape {np.shape(stats)}, layout needs {expected}")


def check_histogram_shape(layout, counts):
    expected = (len(layout.variables), columns.HISTOGRAM_BINS)
    if np.shape(counts) != expected:
        raise ValueError(f"histogram matrix has shape {np.shape(counts)}, layout needs {expected}")


def as_float_array(value, name):
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        return array
    if array.dtype.kind in "fiub" or array.dtype.name == "bfloat16":
        return array.astype(np.float32)  # float16/bfloat16 statistics are computed in float32
    raise TypeError(f"gradient of {name!r} is not numeric (dtype {array.dtype})")
