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
import collections
import contextlib
import io
import logging
import os
import posixpath
import re
import threading
from typing import BinaryIO, Iterator, List, NamedTuple, Optional, Tuple

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
    file = _RemoteFile(url, fs, path, int(info.get("size") or 0), _version(info))
    BLOCKS.opened(file)
    return file


class ByteCounter:
    """A count of bytes (``value``) that threads add to at once (fsspec's loop, readers)."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def add(self, count: int):
        with self._lock:
            self.value += count


# The bytes this process downloaded from stores (`BlockCache` blocks and `ranges.read_ranges`),
# for the benchmarks and tests that check what a read costs.
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
        self._opened = {}  # url -> (version, size) of the object as last opened
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

    def opened(self, file: "_RemoteFile"):
        """Notes the object's state ``file`` was opened with: what `cached` serves."""
        with self._lock:
            self._opened[file.url] = (file.version, file.size)

    def cached(self, url: str, start: int, stop: int) -> Optional[bytes]:
        """Bytes ``[start, stop)`` of ``url`` as it was last opened, when its blocks are all
        here (a scan just read them); None otherwise. A record located by that scan is read
        back from the bytes it was located in, not downloaded again."""
        with self._lock:
            version, size = self._opened.get(url, (None, 0))
            stop = min(stop, size)
            if version is None or start >= stop:
                return None
            indexes = range(start // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES + 1)
            blocks = [self._blocks.get((url, version, index)) for index in indexes]
        if any(block is None for block in blocks):
            return None
        return b"".join(block[max(start - index * BLOCK_BYTES, 0):stop - index * BLOCK_BYTES]
                        for index, block in zip(indexes, blocks))

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
                start, end = _block_span(file, ahead)
                future = asyncio.run_coroutine_threadsafe(
                    file.fs._cat_file(file.path, start=start, end=end), file.fs.loop)
                self._ahead[key] = future
            future.add_done_callback(lambda done, key=key: self._landed(key, done))

    def _landed(self, key, done):
        """A block fetched ahead is kept, then no longer on its way: a reader in between finds
        it in one or the other (in the reverse order it found neither and fetched it again).
        One that failed is left to its reader to fetch (and to raise its error)."""
        if not done.cancelled() and done.exception() is None:
            self._keep(key, done.result())
        with self._lock:
            self._ahead.pop(key, None)

    @staticmethod
    def fetch(file: "_RemoteFile", index: int) -> bytes:
        """Block ``index`` of ``file``, downloaded."""
        start, end = _block_span(file, index)
        with errors_named(file.url):
            return file.fs.cat_file(file.path, start=start, end=end)


def _block_span(file: "_RemoteFile", index: int) -> Tuple[int, int]:
    """``(start, end)`` of block ``index`` of ``file``: `BLOCK_BYTES`, fewer at its end."""
    start = index * BLOCK_BYTES
    return start, min(start + BLOCK_BYTES, file.size)


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
        raise named_error(error, url, writing) from None


def named_error(error: BaseException, url: str, writing: bool = False) -> OSError:
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
