"""Byte ranges of many files read together: a bucket's in concurrent requests, nearby ones
merged, none asking an object's state first (`read_ranges`): how a reader fetches records
scattered over many objects (`event_files.records_located`: a long run's digest, the steps of a
view; `segment_index.in_listing`: a run's indexes) in about one request's time, not one
request per record and object in turn."""

import bisect
import collections
import os
from typing import List, Optional, Sequence, Tuple, Union

from tensorboard_gradients.format import storage


def read_ranges(ranges: Sequence[Tuple[str, int, int]],
                max_gap: Optional[int] = 0) -> List[Union[bytes, OSError]]:
    """The bytes ``[start, stop)`` of each ``(path, start, stop)`` of ``ranges`` (fewer at a
    file's end), or the error naming its path where it could not be read (as
    `storage.errors_named` raises it). A bucket's ranges are fetched in concurrent requests
    (fsspec's ``cat_ranges``), without asking each object's state first, those of one object
    at most ``max_gap`` bytes apart in one request of up to `MERGED_BYTES` (None: a request
    each, whose bytes are not copied out of a longer answer). Bytes whose blocks a reader just
    read (`storage.BlockCache.cached`) are not fetched again. A local file is read with
    ``pread`` (opened as `event_files.open_regular_file` opens it)."""
    results: List[Union[bytes, OSError]] = [b""] * len(ranges)
    by_filesystem = collections.defaultdict(list)  # id(fs) -> [(fs, order, path in fs)]
    directories = {}  # directory URL -> (fs, its path in fs): one lookup each, not per range
    for order, (path, start, stop) in enumerate(ranges):
        if not storage.is_url(path):
            results[order] = _read_local(path, start, stop)
            continue
        cached = storage.BLOCKS.cached(path, start, stop)
        if cached is not None:
            results[order] = cached
            continue
        directory, name = path.rsplit("/", 1)
        try:
            if directory not in directories:
                directories[directory] = storage.filesystem(directory)
        except storage.StorageError as error:
            results[order] = error
            continue
        fs, in_fs = directories[directory]
        by_filesystem[id(fs)].append((fs, order, f"{in_fs}/{name}"))
    for wanted in by_filesystem.values():
        _fetch(wanted[0][0], [(order, in_fs, *ranges[order]) for _, order, in_fs in wanted],
               max_gap, results)
    return results


def _fetch(fs, wanted, max_gap: Optional[int], results: list):
    """Fetches ``wanted`` (``(order, path in fs, url, start, stop)``) from ``fs`` into
    ``results[order]`` (`read_ranges`)."""
    from fsspec.utils import merge_offset_ranges

    paths = [in_fs for _, in_fs, _, _, _ in wanted]
    starts = [start for _, _, _, start, _ in wanted]
    stops = [max(start, stop) for _, _, _, start, stop in wanted]
    merged = ((paths, starts, stops) if max_gap is None else
              merge_offset_ranges(paths, starts, stops, max_gap=max_gap, max_block=MERGED_BYTES))
    try:
        fetched = fs.cat_ranges(*map(list, merged), on_error="return")
    except Exception as error:  # noqa: BLE001 - each store raises its own kinds
        fetched = [error] * len(merged[0])
    storage.DOWNLOADED.add(sum(len(data) for data in fetched if isinstance(data, bytes)))
    if max_gap is None:
        covering = [(start, data) for start, data in zip(starts, fetched)]
    else:
        extents = collections.defaultdict(list)  # path in fs -> [(start, stop, data)], sorted
        for path, start, stop, data in zip(*merged, fetched):
            extents[path].append((start, stop, data))
        covering = [_covering(extents[in_fs], start, stop)
                    for in_fs, start, stop in zip(paths, starts, stops)]
    for (order, _, url, start, stop), (extent_start, data) in zip(wanted, covering):
        if isinstance(data, BaseException):
            data = storage.named_error(data, url)
        elif extent_start != start or len(data) > stop - start:
            data = data[start - extent_start:stop - extent_start]
        results[order] = data


def _covering(extents, start: int, stop: int):
    """``(start, data)`` of the extent of ``extents`` (sorted by start) that holds ``[start,
    stop)``: the last to start at or before it that reaches ``stop`` (merged extents of one
    object may overlap)."""
    index = bisect.bisect_right(extents, start, key=lambda extent: extent[0]) - 1
    while extents[index][1] < stop:
        index -= 1
    return extents[index][0], extents[index][2]


# The most bytes `read_ranges` asks for in one request when it merges ranges: requests of a few
# MB keep a store's connections busy in parallel; one of hundreds would be read alone.
MERGED_BYTES = 8 * 1024 * 1024


def _read_local(path: str, start: int, stop: int) -> Union[bytes, OSError]:
    from tensorboard_gradients.format.event_files import open_regular_file

    try:
        with open_regular_file(path) as file:
            return os.pread(file.fileno(), max(stop - start, 0), start)
    except OSError as error:
        return error
