"""`Store`: which `RunSource` answers for each tag, and what is kept between requests.

For a local logdir every tag of this plugin is read by the plugin itself (`local.LocalReader`):
both loaders then show the same steps, and TensorBoard keeps next to nothing of them. For what
only TensorBoard can read (a ``gs://`` logdir, several logdirs) its data provider is the source
(`provider.ProviderReader`). A source is built once per state of its tag (its ``signature``)
and kept (`cache.Cache`), so a run that stopped changing is never read twice, and routes keep
what they derived from it (`memo`) for as long as it is current.

One bad file must never break the tab for everything else: a tag whose metadata does not parse,
or whose data cannot be read, is a per-tag error (`TagInfo.error`, `UnreadableTagError`); the
plugin lists it with its message and serves every other tag as usual.
"""

import contextlib
import logging
import os
from typing import Dict, Optional, Tuple

from tensorboard_gradients.format import metadata, reader
from tensorboard_gradients.format.inventory import Inventory
from tensorboard_gradients.server.store import event_scan
from tensorboard_gradients.server.store.cache import Cache
from tensorboard_gradients.server.store.local import LocalReader
from tensorboard_gradients.server.store.provider import ProviderReader
from tensorboard_gradients.server.store.source import (
    RunSource, TagInfo, UnknownError, UnreadableTagError,
)

logger = logging.getLogger(__name__)

# What is kept in memory: series read through TensorBoard and the digests of local tags, each
# least recently used first out (the newest always stays).
DEFAULT_CACHE_BYTES = 2 * 1024**3
# The plugin whose tags `Store.inventory` names: what a training job logs first (its loss).
_INVENTORIED_PLUGIN = "scalars"


class Store:
    """This plugin's tags of one TensorBoard, each read from its source (thread-safe).

    ``logdir``: TensorBoard's ``--logdir``; when it is a local directory the plugin reads it
    itself. ``digest_every``: seconds between background passes bringing long local tags'
    digests up to date (0: once; None: none).
    """

    def __init__(self, data_provider, cache_bytes: int = DEFAULT_CACHE_BYTES, *,
                 logdir: Optional[str] = None, digest_every: Optional[float] = None):
        self._provider = data_provider
        self._cache = Cache(cache_bytes)
        scan = event_scan.shared(logdir)  # prescanned from TensorBoard's start
        self._unreadable = scan.unreadable
        self._local = LocalReader(scan, cache_bytes) if scan.readable else None
        self._remote = ProviderReader(data_provider)
        if digest_every is not None and self._local is not None:
            self._local.digest_every(digest_every)

    def tags(self, ctx, experiment) -> Dict[str, Dict[str, TagInfo]]:
        """``{run: {tag: TagInfo}}`` of every tag this plugin wrote, any kind."""
        if self._local is not None:
            return self._local.tags()
        return self._remote.tags(ctx, experiment)

    def has_own_data(self) -> bool:
        """Whether the plugin reads the logdir itself and found this plugin's tags there (a
        bucket TensorBoard's loader cannot read: ``s3://`` on the Rust loader, any scheme only
        fsspec knows)."""
        return self._local is not None and any(self._local.tags().values())

    @staticmethod
    def listed_tags(tags):
        """``(run, tag)`` of what ``runs`` lists: stats tags and tags that cannot be read."""
        for run, run_tags in tags.items():
            for tag, info in run_tags.items():
                if info.parsed is None or info.parsed.kind == metadata.KIND_STATS:
                    yield run, tag

    def source(self, ctx, experiment, run: str, tag: str, tags=None) -> RunSource:
        """The `RunSource` of a stats tag as it stands now (`UnknownError`,
        `UnreadableTagError`)."""
        if tags is None:  # a local logdir: a look at this run's files alone
            tags = (self._local.tags([run]) if self._local is not None
                    else self._remote.tags(ctx, experiment))
        info = stats_tag(tags, run, tag)
        epochs = _of_kind(tags[run].get(metadata.epochs_tag(info.parsed.name)),
                          metadata.KIND_EPOCHS)
        loss = _of_kind(tags[run].get(metadata.loss_tag(info.parsed.name)), metadata.KIND_LOSS)
        histograms, mismatch = _histograms_next_to(tags, run, tag)
        key = ("source", experiment, run, tag)
        with _unreadable_as_error(run, tag):
            if self._local is not None:
                signature = self._local.signature(info)
                source = self._cache.get(key, signature)
                if source is None:
                    source = self._local.source(
                        run, tag, info, None if epochs is None else epochs.parsed,
                        None if histograms is None else histograms.parsed, mismatch)
                    # Its digests' memory is the local reader's, bounded apart.
                    self._cache.put(key, source, signature, 0)
                return source
            signature = (info.signature, None if epochs is None else epochs.signature,
                         None if loss is None else loss.signature, mismatch)
            source = self._cache.get(key, signature)
            if source is None:
                source = self._remote.source(ctx, experiment, run, tag, info, epochs, histograms,
                                             mismatch, self._kept, loss)
                self._cache.put(key, source, signature, source.series.values.nbytes)
            return source

    def _kept(self, key: tuple, signature: tuple, read):
        """``read()`` kept under ``key`` while ``signature`` holds (TensorBoard's histograms)."""
        value = self._cache.get(key, signature)
        if value is None:
            value = read()
            self._cache.put(key, value, signature, value.counts.nbytes)
        return value

    def memo(self, source: RunSource, key: tuple, compute):
        """``compute()`` once per ``key`` for as long as ``source`` is current."""
        return self._cache.derived(source.derived, key, compute)

    def inventory(self, ctx, experiment, location: str, local: bool) -> Inventory:
        """What TensorBoard found at ``location`` (its ``--logdir``, or its ``--logdir_spec``):
        whether it is a directory, its runs and their scalar tags, as the data provider lists
        them (it counts no event files). Only a ``local`` location is checked for being a
        directory: a bucket (``gs://...``) or a spec of several logdirs counts as there, and its
        runs say what was found; a bucket the plugin could not list says why."""
        exists = not local or os.path.isdir(location)
        runs = sorted(run.run_name
                      for run in self._provider.list_runs(ctx, experiment_id=experiment))
        scalars = self._provider.list_scalars(ctx, experiment_id=experiment,
                                              plugin_name=_INVENTORIED_PLUGIN)
        tags = sorted({tag for run_tags in scalars.values() for tag in run_tags})
        return Inventory(location, exists, runs=tuple(runs),
                         tags={_INVENTORIED_PLUGIN: tuple(tags)}, unreadable=self._unreadable)


def stats_tag(tags, run: str, tag: str) -> TagInfo:
    """The `TagInfo` of a stats tag; `UnknownError` / `UnreadableTagError`."""
    info = tags.get(run, {}).get(tag)
    if info is None:
        if run not in tags:
            raise UnknownError(f"no gradients for run {run!r}")
        raise UnknownError(f"no gradients tag {tag!r} in run {run!r}")
    if info.error:
        raise UnreadableTagError(run, tag, info.error)
    if info.parsed.kind != metadata.KIND_STATS:
        raise UnknownError(
            f"{tag!r} in run {run!r} is a {info.parsed.kind} tag, not a stats tag"
        )
    return info


def _of_kind(info: Optional[TagInfo], kind: str) -> Optional[TagInfo]:
    """``info`` when it is a readable tag of ``kind`` (an unreadable one is listed with its
    own error, and the stats tag is served without it)."""
    if info is None or info.parsed is None or info.parsed.kind != kind:
        return None
    return info


def _histograms_next_to(tags, run: str, tag: str) -> Tuple[Optional[TagInfo], Optional[str]]:
    """The histograms tag of stats tag ``tag`` when it can be served (else None), and why it is
    left out when it was logged for other variables (`reader.histograms_mismatch`, the rule of
    `read_logdir` too)."""
    name = metadata.histogram_tag(tag)
    info = _of_kind(tags.get(run, {}).get(name), metadata.KIND_HISTOGRAMS)
    stats = _of_kind(tags.get(run, {}).get(tag), metadata.KIND_STATS)
    if info is None or stats is None:
        return None, None
    mismatch = reader.histograms_mismatch(tag, stats.parsed, name, info.parsed)
    return (None, mismatch) if mismatch else (info, None)


@contextlib.contextmanager
def _unreadable_as_error(run: str, tag: str):
    """Turns any failure to build a tag's data into that tag's `UnreadableTagError`, so one bad
    tag never takes a route down for the others (the traceback is logged)."""
    try:
        yield
    except (UnknownError, UnreadableTagError):
        raise
    except Exception as error:  # noqa: BLE001 - reported per tag, see above
        logger.exception("run %r tag %r cannot be read", run, tag)
        raise UnreadableTagError(
            run, tag, f"its data cannot be read ({type(error).__name__}: {error})"
        ) from error
