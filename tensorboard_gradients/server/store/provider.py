"""`ProviderSource`: a stats tag read through TensorBoard's data provider (both loaders), for
what only TensorBoard can read (a ``gs://`` logdir, several logdirs).

The whole series is read once (each route needs every step: classes depend on a variable's
history) and kept by the registry until the tag changes; its digest under a thresholds is one
block per logged step, judged once. Logged tensors are checked against their tag's metadata
BEFORE TensorBoard decodes them (`decode_guard`: a few-byte record may declare 4.4 TB); a
refused tensor's step is left out and counted. A tag bigger than the Rust data server passes in
one read is read as a sample of steps, and says so (``sampled``).
"""

import collections
import contextlib
import dataclasses
import logging
import threading
from typing import Callable, Dict, Optional, Tuple

import numpy as np
from tensorboard.data import provider

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis.digest import Digest
from tensorboard_gradients.format import metadata
from tensorboard_gradients.format.series import (
    GradientHistograms, GradientSeries, expected_shape, histograms_from_points, loss_curve,
    series_from_points, with_loss,
)
from tensorboard_gradients.server.store.damage import refusal_message
from tensorboard_gradients.server.store.decode_guard import decoding_as, install_decode_guard
from tensorboard_gradients.server.store.source import (
    HistogramAt, RunSource, TagInfo, UnknownError, nearest_index, parsed_info,
)

logger = logging.getLogger(__name__)

_ALL_POINTS = 10**9
# The Rust data server answers ReadTensors in ONE gRPC message and TensorBoard's client refuses
# messages over 256 MiB (server_ingester.py); a tag bigger than that is read sampled (flagged).
_GRPC_MESSAGE_LIMIT = 256 * 1024 * 1024
_SAMPLED_READ_BYTES = 200 * 1024 * 1024


class ProviderSource(RunSource):
    """A stats tag held whole in memory, as TensorBoard delivered it.

    ``histograms``: reads the tag's histograms when first asked for (None: none logged; raises
    `UnknownError` when they are left out)."""

    def __init__(self, series: GradientSeries, sampled: Optional[str], damaged: int,
                 damage: Tuple[str, ...],
                 histograms: Optional[Callable[[], GradientHistograms]]):
        super().__init__(series.at_rows(slice(0, 0)))
        self.series, self.sampled = series, sampled
        self._damaged, self._damage = damaged, damage
        self._histograms = histograms
        self._digests: Dict[analysis.Thresholds, Digest] = {}
        self._lock = threading.Lock()

    def steps(self) -> np.ndarray:
        return self.series.steps

    def rows(self, start: int, stop: int) -> GradientSeries:
        series = self.series
        return dataclasses.replace(series.at_rows(slice(start, stop)), epoch_starts=None,
                                   epoch_indices=None)

    @contextlib.contextmanager
    def reading(self, thresholds: analysis.Thresholds):
        with self._lock:
            digest = self._digests.get(thresholds)
            if digest is None:
                digest = Digest(self.like, thresholds, self.like.epoch_starts,
                                self.like.epoch_indices)
                digest.feed(self.series)
                digest.summarise()
                # The defaults' digest and the latest other one (a user trying thresholds).
                self._digests = {t: d for t, d in self._digests.items()
                                 if t == analysis.Thresholds()}
                self._digests[thresholds] = digest
            yield digest, 0

    @property
    def has_histograms(self) -> bool:
        return self._histograms is not None

    def histogram_near(self, step: int) -> HistogramAt:
        if self._histograms is None:
            raise UnknownError(f"no histograms were logged for run {self.run!r}, tag "
                               f"{self.tag!r}")
        histograms = self._histograms()
        index = nearest_index(histograms.steps, step)
        return HistogramAt(histograms.steps, index, float(histograms.wall_times[index]),
                           histograms.counts[index], histograms.log10_edges,
                           histograms.bin_labels)

    def damage(self):
        return self._damaged, self._damage


class ProviderReader:
    """Lists and reads this plugin's tags through TensorBoard's data provider."""

    def __init__(self, data_provider):
        install_decode_guard()
        self._provider = data_provider

    def tags(self, ctx, experiment) -> Dict[str, Dict[str, TagInfo]]:
        """``{run: {tag: TagInfo}}`` of every tag this plugin wrote, any kind."""
        listing = self._provider.list_tensors(
            ctx, experiment_id=experiment, plugin_name=metadata.PLUGIN_NAME
        )
        result = {}
        for run, tags in listing.items():
            for tag, series in tags.items():
                signature = (series.max_step, series.max_wall_time)
                result.setdefault(run, {})[tag] = parsed_info(series.plugin_content, signature)
        return result

    def source(self, ctx, experiment, run, tag, info: TagInfo, epochs: Optional[TagInfo],
               histograms: Optional[TagInfo], mismatch: Optional[str], kept,
               loss: Optional[TagInfo] = None) -> ProviderSource:
        """The series of stats tag ``tag`` (its `TagInfo` ``info``), its epoch marks, its loss
        (the ``loss`` tag, else the run's own loss scalar) and its histograms (``mismatch``:
        why they are left out whole, or None); ``kept(key, signature, nbytes, read)``: what the
        registry keeps, for the histograms."""
        points, sampled, refusals = self._read(ctx, experiment, run, tag, info.parsed)
        epochs_tag = metadata.epochs_tag(info.parsed.name)
        epoch_points, epochs_refused = (), ()
        if epochs is not None:
            epoch_points, _, epoch_refusals = self._read(ctx, experiment, run, epochs_tag,
                                                         epochs.parsed)
            refused_marks = sum(matrix is None for _, _, matrix in epoch_points)
            if refused_marks:
                epochs_refused = (refusal_message(
                    refused_marks, epoch_refusals, f"its epoch marks ({epochs_tag!r})"),)
        series = series_from_points(run, tag, info.parsed, points, epoch_points)
        refused = series.damaged_points
        series = with_loss(series, *self._loss(ctx, experiment, run, info.parsed.name, loss))

        histogram_tag = metadata.histogram_tag(tag)

        def read_histograms():
            return kept(("histograms", experiment, run, tag), histograms.signature,
                        lambda: self._histograms(ctx, experiment, run, histogram_tag,
                                                 histograms.parsed))

        return ProviderSource(
            series, sampled, refused,
            ((refusal_message(refused, refusals),) if refused else ()) + epochs_refused
            + ((mismatch,) if mismatch else ()),
            None if histograms is None else read_histograms,
        )

    def _loss(self, ctx, experiment, run, name, loss: Optional[TagInfo]):
        """``(curve, source)`` of the run's loss: its ``<name>_loss`` tag, else the first of
        its own loss scalars (`metadata.LOSS_SCALARS`, as TensorBoard keeps them: sampled by
        its ``--samples_per_plugin``); ``(None, None)`` without one."""
        loss_tag = metadata.loss_tag(name)
        scalars = {}
        if loss is None:  # only then are the run's loss scalars asked for
            scalars = self._provider.read_scalars(
                ctx, experiment_id=experiment, plugin_name="scalars", downsample=_ALL_POINTS,
                run_tag_filter=provider.RunTagFilter(runs=[run],
                                                     tags=list(metadata.LOSS_SCALARS)),
            ).get(run, {})
        tag = metadata.loss_source(
            name, lambda t: loss is not None if t == loss_tag else bool(scalars.get(t)))
        if tag is None:
            return None, None
        if tag == loss_tag:
            points, _, _ = self._read(ctx, experiment, run, loss_tag, loss.parsed)
            return loss_curve(run, loss_tag, [p for p in points if p[2] is not None]), loss_tag
        return loss_curve(run, tag, [(d.step, d.wall_time, d.value) for d in scalars[tag]]), tag

    def _histograms(self, ctx, experiment, run, histogram_tag, parsed) -> GradientHistograms:
        points, _, _ = self._read(ctx, experiment, run, histogram_tag, parsed)
        histograms = histograms_from_points(run, histogram_tag, parsed, points)
        if histograms is None:
            raise UnknownError(f"no histograms were logged for run {run!r}, tag "
                               f"{histogram_tag!r}")
        return histograms

    def _read(self, ctx, experiment, run, tag, parsed):
        """(points as (step, wall_time, ndarray or None if refused), why sampled or None,
        refusal reasons)."""
        expected = expected_shape(parsed)
        refusals = collections.Counter()

        def read(downsample):
            with decoding_as(expected, refusals):
                result = self._provider.read_tensors(
                    ctx,
                    experiment_id=experiment,
                    plugin_name=metadata.PLUGIN_NAME,
                    downsample=downsample,
                    run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
                )
            return [(d.step, d.wall_time, d.numpy) for d in result.get(run, {}).get(tag, ())]

        try:
            return read(_ALL_POINTS), None, refusals
        except Exception as error:  # noqa: BLE001 - only the gRPC size error is handled
            if not _too_big_for_grpc(error):
                raise
        # float32 statistics (float64 ones when a gradient was float64: then halve again).
        point_bytes = 4 * max(1, int(np.prod(expected)))
        kept = max(1, _SAMPLED_READ_BYTES // point_bytes)
        while True:
            logger.warning(
                "run %r tag %r exceeds the data server's %d MiB per-read limit; reading %d "
                "sampled steps", run, tag, _GRPC_MESSAGE_LIMIT >> 20, kept,
            )
            refusals.clear()
            try:
                points = read(kept)
                break
            except Exception as error:  # noqa: BLE001
                if not _too_big_for_grpc(error) or kept == 1:
                    raise
                kept = max(1, kept // 2)
        return points, (
            f"this tag holds more data than TensorBoard's data server passes in one read "
            f"({_GRPC_MESSAGE_LIMIT >> 20} MiB), so only {len(points)} sampled steps are shown; "
            "start TensorBoard with --load_fast=false to see every logged step"
        ), refusals


def _too_big_for_grpc(error) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and getattr(code(), "name", "") == "RESOURCE_EXHAUSTED"
