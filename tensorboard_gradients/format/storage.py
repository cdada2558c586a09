"""Where a logdir lives: a local directory, or a bucket (or any filesystem) named by an fsspec URL.

``s3://bucket/logs``, ``gs://bucket/logs`` and any other ``scheme://`` URL that fsspec knows are
read through fsspec (``pip install tensorboard-gradients[s3]`` or ``[gcs]`` brings its S3 and
GCS filesystems); a plain path, or a ``file://`` URL, is a local directory. The readers
(`reader.read_logdir`, the CLI, the plugin's scan) list and open event files only through this
module, so both kinds are read alike: every record of every file, nothing sampled; the writers'
uploads (`segments`) name their errors with it.

Credentials come from each store's own standard places (``AWS_*`` variables, ``~/.aws``,
``GOOGLE_APPLICATION_CREDENTIALS``, instance metadata), as its fsspec filesystem finds them; the
endpoint too (``AWS_ENDPOINT_URL`` for an S3-compatible store, ``STORAGE_EMULATOR_HOST`` for a
GCS emulator). Nothing here logs or prints them: a URL is shown without its ``user:password@``.

A store that does not answer raises a `StorageError` naming the URL within `TIMEOUT_SECONDS`
(connection) or `READ_TIMEOUT_SECONDS` (a read), after the store's own few retries: a reader is
never left hanging on the network.
"""

import asyncio
import bisect
import collections
import contextlib
import io
import logging
import os
import posixpath
import re
import threading
from typing import BinaryIO, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

logger = logging.getLogger(__name__)

# How long connecting to a store may take, and one read from it, before the reader gives up
# (seconds): S3 and GCS answer a request in well under a second; these leave room for a slow
# network without leaving a CLI or a TensorBoard request waiting for minutes.
TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 60
# How long TensorBoard's start waits for a bucket logdir to answer (`logdir_root`): S3 gives up on
# an address that never answers after three tries of `TIMEOUT_SECONDS`, gcsfs retries for
# minutes; past this the plugin leaves the logdir to TensorBoard's loader and says why.
START_SECONDS = 20.0

# A remote object is read in blocks of this size (bytes), a request each (`BlockCache`): big
# enough that a scan of a long run makes few requests (one per ~80 steps of 1,000 variables),
# small enough that a step read back alone does not fetch much of the run.
BLOCK_BYTES = 4 * 1024 * 1024

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")

# Per scheme: the options that bound how long the store is waited for.
_TIME_LIMITS = {
    "s3": {"config_kwargs": {"connect_timeout": TIMEOUT_SECONDS,
                             "read_timeout": READ_TIMEOUT_SECONDS,
                             "retries": {"max_attempts": 3, "mode": "standard"}}},
    "gs": {"timeout": READ_TIMEOUT_SECONDS, "requests_timeout": READ_TIMEOUT_SECONDS},
}
_TIME_LIMITS.update({"s3a": _TIME_LIMITS["s3"], "gcs": _TIME_LIMITS["gs"]})

# The package that brings each scheme's filesystem, for the message when it is missing.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class StorageError(OSError):
    """A remote logdir or file could not be listed or read; the message names the URL (without
    credentials) and what the store answered."""


def is_url(path) -> bool:
    """Whether ``path`` is read through fsspec: a ``scheme://`` URL other than ``file://``."""
    match = _SCHEME.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    return bool(match) and match.group(1).lower() != "file"


def shown(path: str) -> str:
    """``path`` as messages show it: a URL without its ``user:password@``."""
    return _USER_INFO.sub(r"\1", str(path))


def local_path(path: str) -> str:
    """A local path, or the path of a ``file://`` URL."""
    path = os.fspath(path)
    return path[len("file://"):] if path.lower().startswith("file://") else path


def is_directory(logdir: str) -> bool:
    """Whether ``logdir`` is a directory (for a bucket: a bucket, or a prefix with objects).

    Raises:
      StorageError: the store could not be asked (unreachable, permission denied, ...).
    """
    if not is_url(logdir):
        return os.path.isdir(local_path(logdir))
    fs, root = filesystem(logdir)
    with errors_named(logdir):
        return fs.isdir(root)


def walk_event_directories(logdir: str, is_wanted, onerror) -> Iterator[Tuple[str, str, List[str]]]:
    """``(directory, run, file names)`` of every directory under ``logdir`` (itself included)
    holding files ``is_wanted(name)`` accepts, in sorted order; ``run`` is the directory relative
    to ``logdir`` with ``/`` separators (``"."`` for ``logdir`` itself, as TensorBoard names
    runs), ``directory`` what `join` takes. A local directory that cannot be
    listed is passed to ``onerror`` (an `OSError`) and skipped.

    Raises:
      StorageError: a remote logdir could not be listed.
    """
    if not is_url(logdir):
        root = local_path(logdir)
        for directory, _, files in sorted(os.walk(root, onerror=onerror)):
            names = sorted(f for f in files if is_wanted(f))
            if names:
                yield directory, os.path.relpath(directory, root).replace(os.sep, "/"), names
        return
    fs, root = filesystem(logdir)
    root = root.rstrip("/")
    with errors_named(logdir):
        fs.invalidate_cache(root)  # a listing cached by an earlier read misses new files
        found = fs.find(root, detail=False)
    by_directory = collections.defaultdict(list)
    for path in found:
        directory, name = posixpath.split(path)
        if is_wanted(name):
            by_directory[directory].append(name)
    for directory in sorted(by_directory):
        run = posixpath.relpath(directory, root) if directory != root else "."
        yield fs.unstrip_protocol(directory), run, sorted(by_directory[directory])


class FileState(NamedTuple):
    """What says a file changed: its size, and ``version`` (a local file's mtime in ns; an
    object's generation, ETag or modification time, whichever its store lists)."""

    size: int
    version: object


def event_listing(directory: str, is_wanted):
    """``(regular, special)``: ``(name, path, FileState)`` of the files directly in
    ``directory`` that ``is_wanted(name)`` accepts, and ``(name, what it is)`` of what is named
    so but is not a regular file (a FIFO would hang whoever opens it; in a bucket, a "directory"
    prefix), both sorted; one listing (``([], [])`` when it cannot be listed, which a remote
    directory logs)."""
    from tensorboard_gradients.format.event_files import file_type

    regular, special = [], []
    if not is_url(directory):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return [], []
        for entry in entries:
            if not is_wanted(entry.name):
                continue
            try:
                status = entry.stat()  # follows a symlink, as opening it would
                if entry.is_file():
                    regular.append((entry.name, entry.path,
                                    FileState(status.st_size, status.st_mtime_ns)))
                else:
                    special.append((entry.name, file_type(status.st_mode)))
            except OSError:
                continue  # gone since it was listed
        return sorted(regular), sorted(special)
    fs, path = filesystem(directory)
    try:
        with errors_named(directory):
            fs.invalidate_cache(path)
            entries = fs.ls(path, detail=True)
    except OSError as error:
        logger.warning("tensorboard-gradients cannot list %s: %s", shown(directory), error)
        return [], []
    for info in entries:
        name = posixpath.basename(info["name"].rstrip("/"))
        if not is_wanted(name):
            continue
        if info.get("type") == "directory":
            special.append((name, "a directory"))
        else:
            regular.append((name, fs.unstrip_protocol(info["name"]),
                            FileState(int(info.get("size") or 0), _version(info))))
    return sorted(regular), sorted(special)


def _version(info: dict):
    """What changes when an object is rewritten, from its listing (stores name it differently)."""
    for key in ("generation", "ETag", "etag", "md5Hash", "LastModified", "updated", "mtime"):
        if info.get(key) is not None:
            return str(info[key])
    return None


def logdir_root(logdir: Optional[str]) -> Optional[str]:
    """The logdir as the plugin's scan names it: a local directory's real path, a URL without
    its trailing ``/``; None when it is not a directory (nor a bucket prefix with objects).
    A bucket is given `START_SECONDS` to answer: TensorBoard waits for this before it starts.

    Raises:
      OSError: a bucket that cannot be asked (`is_directory`), or that did not answer in time.
    """
    if not logdir:
        return None
    if not is_url(logdir):
        return os.path.realpath(local_path(logdir)) if is_directory(logdir) else None
    answer = {}

    def ask():
        try:
            answer["directory"] = is_directory(logdir)
        except OSError as error:
            answer["error"] = error

    asking = threading.Thread(target=ask, daemon=True, name="tensorboard-gradients logdir")
    asking.start()
    asking.join(START_SECONDS)  # a store still retrying is left to finish on its own
    if "error" in answer:
        raise answer["error"]
    if "directory" not in answer:
        raise StorageError(f"cannot read {shown(logdir)!r}: no answer in {START_SECONDS:g} s")
    return logdir.rstrip("/") if answer["directory"] else None


def run_directory(root: str, run: str) -> Optional[str]:
    """The directory of ``run`` (a run name: relative, ``/`` separators) under ``root`` (a
    `logdir_root`), or None when the name leads outside it (``..``, a symlink out)."""
    if "\0" in run:  # no path holds a NUL byte
        return None
    if is_url(root):
        if run == ".":
            return root
        if any(part in ("", ".", "..") for part in run.split("/")):
            return None
        return f"{root}/{run}"
    directory = os.path.realpath(os.path.join(root, *run.split("/")))
    inside = directory == root or directory.startswith(root + os.sep)
    return directory if inside and os.path.isdir(directory) else None


def read_at(file, offset: int, count: int) -> bytes:
    """``count`` bytes at ``offset`` of an open file, its position unchanged."""
    if isinstance(file, _RemoteFile):
        return file.read_at(offset, count)
    return os.pread(file.fileno(), count, offset)


def join(directory: str, name: str) -> str:
    """A file ``name`` in ``directory`` (a local path or a URL)."""
    return f"{directory.rstrip('/')}/{name}" if is_url(directory) else os.path.join(directory, name)


def open_remote(url: str) -> BinaryIO:
    """``url`` opened for binary reading: a seekable file of the object as it is now (``size``
    its size), read in `BLOCK_BYTES` blocks through the process's `BlockCache`.

    Raises:
      FileNotFoundError: no such object; StorageError: it could not be read.
    """
    fs, path = filesystem(url)
    with errors_named(url):
        fs.invalidate_cache(path)  # as the object is now: deleted or rewritten since listed
        info = fs.info(path)
    if info.get("type") == "directory":
        from tensorboard_gradients.format.event_files import NotARegularFileError

        raise NotARegularFileError(f"{shown(url)!r} is a directory, not a regular file")
    return _RemoteFile(url, fs, path, int(info.get("size") or 0), _version(info))


def read_ranges(ranges: Sequence[Tuple[str, int, int]],
                max_gap: Optional[int] = 0) -> List[Union[bytes, OSError]]:
    """The bytes ``[start, stop)`` of each ``(path, start, stop)`` of ``ranges`` (fewer at a
    file's end), or the error naming its path where it could not be read (as `errors_named`
    raises it). A bucket's ranges are fetched in concurrent requests (fsspec's ``cat_ranges``),
    without asking each object's state first, those of one object at most ``max_gap`` bytes
    apart in one request of up to `MERGED_BYTES` (None: a request each, whose bytes are not
    copied out of a longer answer): a reader of records scattered over many objects (a
    digest's, a segment's indexes) waits for about one request, not one per record and
    object. A local file is read with ``pread`` (opened as `event_files.open_regular_file`
    opens it)."""
    results: List[Union[bytes, OSError]] = [b""] * len(ranges)
    by_filesystem = collections.defaultdict(list)  # id(fs) -> [(fs, order, path in fs)]
    directories = {}  # directory URL -> (fs, its path in fs): one lookup each, not per range
    for order, (path, start, stop) in enumerate(ranges):
        if not is_url(path):
            results[order] = _read_local(path, start, stop)
            continue
        directory, name = path.rsplit("/", 1)
        try:
            if directory not in directories:
                directories[directory] = filesystem(directory)
        except StorageError as error:
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
    DOWNLOADED.add(sum(len(data) for data in fetched if isinstance(data, bytes)))
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
            data = _named_error(data, url)
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


class ByteCounter:
    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def add(self, count: int):
        with self._lock:
            self.value += count


# The bytes this process downloaded from stores (`BlockCache` blocks and `read_ranges`), for the
# benchmarks and tests that check what a read costs.
DOWNLOADED = ByteCounter()


class BlockCache:
    """The blocks of remote objects read lately, shared by every open file of the process.

    A reader opens an object several times (the scan locating its records, the checksum
    verification, the steps read back): on a local disk the operating system's page cache
    serves the later reads, from a bucket each would download it again. Blocks are keyed by the
    object's version, so a rewritten object is read anew; the least recently used go first once
    they hold more than ``limit_bytes``.

    A reader going through an object in order (each block it asks the one after the last) has
    the next `READ_AHEAD_BLOCKS` fetched meanwhile, as an operating system reads ahead of a
    file read in order: the store sends them while the reader parses this one (an async
    fsspec filesystem's requests, on its own event loop; none for another filesystem).
    """

    def __init__(self, limit_bytes: int):
        self._limit = limit_bytes
        self._blocks = collections.OrderedDict()  # (url, version, index) -> bytes
        self._ahead = {}  # (url, version, index) -> concurrent Future of a block fetched ahead
        self._bytes = 0
        self._lock = threading.Lock()

    def block(self, file: "_RemoteFile", index: int, in_order: bool = False) -> bytes:
        """Block ``index`` of ``file``; ``in_order``: the reader asked the block before it
        last, so the blocks after it are fetched ahead."""
        key = (file.url, file.version, index)
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
            ahead = self._ahead.get(key) if data is None else None
        if ahead is not None:
            try:
                data = ahead.result(timeout=READ_TIMEOUT_SECONDS)
            except Exception:  # noqa: BLE001 - fetched again below, its error then named
                data = None
        if data is None:
            data = self.fetch(file, index)  # outside the lock: readers never wait in line
            self._keep(key, data)
        if in_order:
            self._read_ahead(file, index)
        return data

    def _keep(self, key, data: bytes):
        DOWNLOADED.add(len(data))
        with self._lock:
            if key not in self._blocks:
                self._blocks[key] = data
                self._bytes += len(data)
            while self._bytes > self._limit and len(self._blocks) > 1:
                _, dropped = self._blocks.popitem(last=False)
                self._bytes -= len(dropped)

    def _read_ahead(self, file: "_RemoteFile", index: int):
        if not getattr(file.fs, "async_impl", False):
            return
        last = min(index + READ_AHEAD_BLOCKS, (file.size - 1) // BLOCK_BYTES)
        for ahead in range(index + 1, last + 1):
            key = (file.url, file.version, ahead)
            with self._lock:
                if key in self._blocks or key in self._ahead:
                    continue
                start = ahead * BLOCK_BYTES
                future = asyncio.run_coroutine_threadsafe(file.fs._cat_file(
                    file.path, start=start, end=min(start + BLOCK_BYTES, file.size)),
                    file.fs.loop)
                self._ahead[key] = future
            future.add_done_callback(lambda done, key=key: self._landed(key, done))

    def _landed(self, key, done):
        """A block fetched ahead is kept; one that failed is left to its reader to fetch (and
        to raise its error)."""
        with self._lock:
            self._ahead.pop(key, None)
        if not done.cancelled() and done.exception() is None:
            self._keep(key, done.result())

    @staticmethod
    def fetch(file: "_RemoteFile", index: int) -> bytes:
        """Block ``index`` of ``file``, downloaded."""
        start = index * BLOCK_BYTES
        with errors_named(file.url):
            return file.fs.cat_file(file.path, start=start,
                                    end=min(start + BLOCK_BYTES, file.size))


# How many blocks `BlockCache` fetches ahead of a reader going through an object in order: 16 MB,
# a few requests in flight while a scan parses one block (~10 ms a block from a store on
# loopback, more over a network).
READ_AHEAD_BLOCKS = 4


# The blocks kept: a long run's scan reads its objects once, then reads back its steps from here.
BLOCKS = BlockCache(256 * 1024 * 1024)


class _RemoteFile(io.RawIOBase):
    """A remote object read through `BLOCKS`, as a seekable binary file; its reads raise errors
    naming its URL (an object deleted while read, a connection lost), as `errors_named`."""

    def __init__(self, url: str, fs, path: str, size: int, version):
        super().__init__()
        self.url, self.fs, self.path, self.size, self.version = url, fs, path, size, version
        self._position = 0
        self._last_block = -2  # no block read yet: the first read is not "in order"

    def readable(self):
        return True

    def seekable(self):
        return True

    def read_at(self, offset: int, count: int) -> bytes:
        """`read_at`: up to ``count`` bytes at ``offset`` (fewer at the end of the object)."""
        stop = min(offset + max(count, 0), self.size)
        pieces = []
        while offset < stop:
            index, within = divmod(offset, BLOCK_BYTES)
            piece = BLOCKS.block(self, index, in_order=index == self._last_block + 1)
            self._last_block = index
            piece = piece[within:within + stop - offset]
            if not piece:
                break  # the object is shorter than listed: it changed meanwhile
            pieces.append(piece)
            offset += len(piece)
        return b"".join(pieces)

    def read(self, size=-1):
        data = self.read_at(self._position, self.size - self._position if size is None or
                            size < 0 else size)
        self._position += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self):
        return self._position


def file_size(file) -> int:
    """The size of an open file: a remote one knows it (`open_remote`), a local one is asked."""
    size = getattr(file, "size", None)
    return size if isinstance(size, int) else os.fstat(file.fileno()).st_size


def filesystem(url: str):
    """``(fsspec filesystem, path in it)`` of ``url``, with the scheme's time limits.

    Raises:
      StorageError: its filesystem is not installed (the message says which extra brings it),
        or the scheme is unknown.
    """
    scheme = _SCHEME.match(url).group(1).lower()
    try:
        import fsspec
    except ImportError:
        raise StorageError(_missing_package(url, scheme, "fsspec")) from None
    try:
        return fsspec.core.url_to_fs(url, **_TIME_LIMITS.get(scheme, {}))
    except ImportError as error:  # the scheme's filesystem is not installed
        raise StorageError(_missing_package(url, scheme, error.name or str(error))) from None
    except ValueError as error:  # an unknown protocol
        raise StorageError(f"cannot use {shown(url)!r}: {error}") from None


def _missing_package(url: str, scheme: str, package: str) -> str:
    extra = _EXTRAS.get(scheme)
    install = (f"pip install 'tensorboard-gradients[{extra}]'" if extra
               else f"install fsspec's filesystem for {scheme}://")
    return f"cannot use {shown(url)!r}: {package} is not installed ({install})"


@contextlib.contextmanager
def errors_named(url: str, writing: bool = False):
    """Turns what a store raises while reading (``writing``: uploading) ``url`` into an error
    naming it, without credentials, and saying what the store answered in a line (never the
    request's headers): FileNotFoundError (no such object, prefix or bucket), PermissionError,
    else `StorageError`."""
    from tensorboard_gradients.format.event_files import NotARegularFileError

    try:
        yield
    except (StorageError, NotARegularFileError):
        raise
    except Exception as error:  # noqa: BLE001 - each store raises its own kinds
        raise _named_error(error, url, writing) from None


def _named_error(error: BaseException, url: str, writing: bool = False) -> OSError:
    """What `errors_named` raises for ``error``, raised while reading (``writing``: uploading)
    ``url``."""
    if isinstance(error, StorageError):
        return error
    reason, where = _reason(error), shown(url)
    if isinstance(error, FileNotFoundError):
        return FileNotFoundError(f"cannot write {where!r}: no such bucket ({reason})" if writing
                                 else f"no such log directory or file: {where!r} ({reason})")
    if isinstance(error, PermissionError):
        return PermissionError(f"permission denied {'writing' if writing else 'reading'} "
                               f"{where!r} ({reason})")
    return StorageError(f"cannot {'write' if writing else 'read'} {where!r}: {reason}")


def _reason(error: BaseException) -> str:
    """What went wrong, in a line, without the request's headers or signature."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
