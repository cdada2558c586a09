"""`GradientWriter`: the TF-free writer (numpy arrays in, TensorBoard event files out).

Writes exactly what the TensorFlow summary op writes for the same inputs (same tags, metadata,
matrix layout and statistics), without importing TensorFlow: for PyTorch, JAX and numpy users.
"""

import logging
import threading
import time
from typing import Mapping, Optional

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from tensorboard_gradients import event_files, metadata, statistics

logger = logging.getLogger(__name__)


class GradientWriter:
    """Logs per-variable gradient statistics for one model to ``logdir``.

    Example::

        with GradientWriter("logs/run1") as writer:
            for step in range(steps):
                grads = ...  # {"dense/kernel": np.ndarray, ...}, model order (input side first)
                writer.write(step, grads, weights=params, histograms=step % 100 == 0)

    Args:
      logdir: the run directory (TensorBoard shows its path relative to ``--logdir``). The event
        file is created on the first `write`, so constructing a writer touches no disk.
      name: the summary name = the tag (see `metadata` for the ``_varset<k>`` rule when the
        variable set changes).
    """

    def __init__(self, logdir: str, name: str = metadata.DEFAULT_NAME):
        self._events = event_files.EventFileWriter(logdir)
        self._name = name
        self._tags = metadata.LayoutTags()
        self._described = set()
        self._lock = threading.Lock()
        self._missing = metadata.MissingGradientWarnings(logger)

    @property
    def logdir(self):
        return self._events.logdir

    def write(
        self,
        step: int,
        gradients: Mapping[str, Optional[object]],
        weights: Optional[Mapping[str, object]] = None,
        histograms: bool = False,
    ) -> str:
        """Writes one step's statistics (and, if `histograms`, the |g| distribution).

        Args:
          step: the optimizer step (an int).
          gradients: variable name -> gradient array, in model order (input side first). A None
            gradient is logged as missing (a row of NaN), not as zeros.
          weights: variable name -> value, for the `weight_l2_norm` column; every variable of
            `gradients` must have one.
          histograms: also write the log10|g| histograms under ``<tag>_histograms``.

        Returns:
          The tag written to.
        """
        if not gradients:
            raise ValueError("GradientWriter.write needs at least one gradient")
        names = list(gradients)
        if weights is not None:
            absent = [n for n in names if n not in weights]
            if absent:
                raise ValueError(f"weights missing for variables {absent[:5]}")
        arrays = {n: None if g is None else _as_float_array(g, n) for n, g in gradients.items()}
        weight_arrays = (
            None if weights is None else {n: _as_float_array(weights[n], n) for n in names}
        )
        self._missing.warn([n for n in names if arrays[n] is None])
        dtype = statistics.NumpyOps.computation_dtype(
            [a.dtype for a in arrays.values() if a is not None]
        )
        shapes = [
            (weight_arrays[n].shape if weight_arrays else None) if arrays[n] is None else arrays[n].shape
            for n in names
        ]
        layout = metadata.Layout.create(names, shapes, with_weights=weights is not None)
        entries = [
            None if arrays[n] is None else (arrays[n].astype(dtype, copy=False), arrays[n].size)
            for n in names
        ]
        ops = statistics.NumpyOps
        with np.errstate(over="ignore", invalid="ignore"):  # overflow routes to the masked pass
            stats = statistics.statistics_matrix(
                ops,
                entries,
                None if weight_arrays is None else [weight_arrays[n].astype(dtype, copy=False) for n in names],
                dtype,
            )
            counts = statistics.histogram_matrix(ops, entries, dtype) if histograms else None
        return self.write_statistics(step, layout, stats, counts)

    def write_statistics(
        self,
        step: int,
        layout: metadata.Layout,
        stats: np.ndarray,
        histogram_counts: Optional[np.ndarray] = None,
    ) -> str:
        """Writes matrices computed elsewhere (e.g. on the accelerator, inside a train step).

        Args:
          step: the step.
          layout: what the rows and columns mean (`metadata.Layout`).
          stats: ``[len(layout.variables), len(layout.stats)]``.
          histogram_counts: optional ``[len(layout.variables), metadata.HISTOGRAM_BINS]``.

        Returns:
          The tag written to.
        """
        expected = (len(layout.variables), len(layout.stats))
        if np.shape(stats) != expected:
            raise ValueError(f"stats matrix has shape {np.shape(stats)}, layout needs {expected}")
        with self._lock:
            tag = self._tags.tag_for(self._name, layout)
            self._write_tensor(
                step, tag, stats, metadata.stats_metadata_content(self._name, layout)
            )
            if histogram_counts is not None:
                self._write_histograms(step, tag, layout, histogram_counts)
            self._events.flush()
        return tag

    def write_histograms(self, step: int, layout: metadata.Layout, counts: np.ndarray) -> str:
        """Writes a histogram matrix computed elsewhere, for a step without statistics."""
        with self._lock:
            tag = self._tags.tag_for(self._name, layout)
            self._write_histograms(step, tag, layout, counts)
            self._events.flush()
        return metadata.histogram_tag(tag)

    def _write_histograms(self, step, tag, layout, counts):
        expected = (len(layout.variables), metadata.HISTOGRAM_BINS)
        if np.shape(counts) != expected:
            raise ValueError(f"histogram matrix has shape {np.shape(counts)}, layout needs {expected}")
        self._write_tensor(
            step,
            metadata.histogram_tag(tag),
            counts,
            metadata.histogram_metadata_content(self._name, layout),
        )

    def write_epoch(self, step: int, epoch: int):
        """Marks that epoch `epoch` (0-based) starts at `step` (tag ``<name>_epochs``)."""
        with self._lock:
            self._write_tensor(
                step,
                metadata.epochs_tag(self._name),
                np.array(epoch, dtype=np.float64),
                metadata.epochs_metadata_content(self._name),
            )
            self._events.flush()

    def write_scalars(self, step: int, scalars: Mapping[str, float]):
        """Writes ordinary TensorBoard scalars (Scalars dashboard) under ``<name>/<key>``."""
        events = []
        for key, value in scalars.items():
            tag = f"{self._name}/{key}"
            summary_value = summary_pb2.Summary.Value(
                tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value))
            )
            if tag not in self._described:
                summary_value.metadata.CopyFrom(scalar_metadata.create_summary_metadata(tag, ""))
                self._described.add(tag)
            events.append(summary_value)
        with self._lock:
            self._events.write(
                event_pb2.Event(
                    wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=events)
                )
            )
            self._events.flush()

    def _write_tensor(self, step, tag, array, content):
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(array))
        if tag not in self._described:
            # Loaders read metadata once per tag; writing it once keeps events small.
            value.metadata.CopyFrom(metadata.create_summary_metadata(content))
            self._described.add(tag)
        self._events.write(
            event_pb2.Event(
                wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=[value])
            )
        )

    def flush(self):
        self._events.flush()

    def close(self):
        """Closes the event file; a later write starts a new, self-describing file."""
        with self._lock:
            self._events.close()
            self._described.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _as_float_array(value, name):
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        return array
    if array.dtype.kind in "fiub" or array.dtype.name == "bfloat16":
        return array.astype(np.float32)  # float16/bfloat16 statistics are computed in float32
    raise TypeError(f"gradient of {name!r} is not numeric (dtype {array.dtype})")
