"""What the plugin reads itself from a logdir's event files, per run: where each logged
point of its tags lies, and what is damaged on disk.

Every record of every event file is scanned once, then only a growing file's new bytes (a
request on unchanged files costs one ``stat`` per file), noting for every intact record where
the points of this plugin's tags lie (file, offset, value): `EventFileIntegrity.located` lists a
tag's logged steps with their records, which `local_tag` reads back a few thousand at a time,
never all at once. A step logged twice is its last record's, in file-name order, whatever file
each writer wrote (two writers on interleaved steps show every step).

What is left out is noted and said (`damage.RunDamage`): a record failing its checksum costs its
own steps (TensorBoard's Rust loader would serve its wrong values, its Python loader stop
reading the file there); a tensor that is not what its tag's metadata says (a "bomb" declaring
terabytes, a string) is refused before it is ever decoded; records that do not parse are counted
per file; anything named like an event file that is not a regular file (a FIFO, which would
hang whoever opens it, a directory) is named and skipped, and never hides another run.

A scan reads a big record's first bytes only (`event_files.skim_records`), which name its step
and tag; its data checksum is verified afterwards, inline while few bytes wait for it, else in a
background thread that yields to requests (`traffic.REQUESTS`). So a long run's first answer
does not wait for its 5 GB to be read: until verified, a damaged big record's step is located
(reading it back finds it damaged) and not yet counted as damage. In a bucket, a segment its
writer indexed (`format.segment_index`) is located from its index, without a byte of it read,
and verified in the background (`file_scan`): a bucket run's first answer does not wait for
its download.
"""

import dataclasses
import itertools
import logging
import os
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from tensorboard_gradients.format import event_files, segment_index, storage
from tensorboard_gradients.server.store import file_scan, traffic
from tensorboard_gradients.server.store.damage import NO_DAMAGE, RunDamage, counted

logger = logging.getLogger(__name__)

# Unverified bytes a scan verifies before it returns (a short run's, or a long run's latest
# steps); more are verified in the background, `VERIFY_RECORDS` at a time (~45 MB for 1,000
# variables).
VERIFY_INLINE_BYTES = 64 * 1024 * 1024
VERIFY_RECORDS = 200


@dataclasses.dataclass(frozen=True)
class Located:
    """A tag's logged points in a run's intact records: ``steps`` in order (a step logged twice:
    its last record, in file-name order as TensorBoard reads), each with its wall time and
    ``(path, offset, value index)``. ``look``: how many looks at the files its checker had
    taken when it was built (a later one knows better, even when it lists fewer steps: a
    verification took a damaged record's step back)."""

    steps: np.ndarray
    wall_times: np.ndarray
    locations: Tuple[Tuple[str, int, int], ...]
    look: int = 0


class RunLook:
    """One look at a run's event files (`EventFileIntegrity.look`): what each file held then."""

    def __init__(self, checker: "EventFileIntegrity", run: str, directory: str, files, skipped,
                 number):
        self._checker = checker
        self.run, self.directory = run, directory
        self._files = files  # (name, path, its file_scan.FileScan or why it cannot be checked)
        self._skipped = skipped
        self.number = number  # equal numbers: the files held the same
        self._by_tag = None  # tag -> the (path, scan) holding points of it
        self._damage = None

    def _scans(self):
        return [(name, path, scan) for name, path, scan in self._files
                if isinstance(scan, file_scan.FileScan)]

    def located(self, tag: str) -> Located:
        """Where the points of ``tag`` lie in the run's intact records (built once per look)."""
        checker = self._checker
        with checker._lock:
            cached = checker._located.get((self.directory, tag))
            if cached is not None and cached[0] == self.number:
                return cached[1]
            if self._by_tag is None:
                self._by_tag = {}
                for _, path, scan in self._scans():
                    for name in scan.points:
                        self._by_tag.setdefault(name, []).append((path, scan))
            by_step = {}
            for path, scan in self._by_tag.get(tag, ()):
                for step, wall_time, offset, index in scan.points.get(tag, ()):
                    by_step[step] = (wall_time, (path, offset, index))
            steps = sorted(by_step)
            located = Located(np.array(steps, dtype=np.int64),
                              np.array([by_step[s][0] for s in steps], dtype=np.float64),
                              tuple(by_step[s][1] for s in steps), self.number)
            checker._located[(self.directory, tag)] = (self.number, located)
            return located

    def contents(self) -> Dict[str, bytes]:
        """``{tag: metadata content}`` of this plugin's tags in the run, by their first metadata
        in file-name order (as TensorBoard reads it)."""
        contents = {}
        with self._checker._lock:
            for _, _, scan in self._scans():
                for tag, content in scan.contents.items():
                    contents.setdefault(tag, content)
        return contents

    def damage(self) -> RunDamage:
        """What the run's files lost: records failing their checksum (their steps, by tag),
        tensors refused, records that do not parse, broken framing, files that cannot be
        checked or are not regular files (found once per look)."""
        if self._damage is None:
            self._damage = self._found_damage()
        return self._damage

    def _found_damage(self) -> RunDamage:
        steps, refused, messages = {}, {}, list(self._skipped)
        with self._checker._lock:
            for name, _, scan in self._files:
                if not isinstance(scan, file_scan.FileScan):
                    messages.append(scan)
                    continue
                for tag, tag_steps in scan.damaged_steps.items():
                    steps.setdefault(tag, {}).update(dict.fromkeys(tag_steps, name))
                for tag, reasons in scan.refused.items():
                    refused.setdefault(tag, {}).update(reasons)
                if scan.unreadable:
                    messages.append(
                        f"{counted(scan.unreadable, 'record', 'records')} of {name} "
                        f"{'fails its' if scan.unreadable == 1 else 'fail their'} checksum and "
                        "cannot be read: the steps they held are missing"
                    )
                if scan.broken_at is not None:
                    messages.append(
                        f"{name} is damaged at byte {scan.broken_at} (a record length fails "
                        "its checksum): nothing after it can be read"
                    )
        if not (steps or refused or messages):
            return NO_DAMAGE
        return RunDamage(steps, tuple(messages), refused)


class EventFileIntegrity:
    """Checks the record checksums of a logdir's event files, per run (thread-safe): a local
    directory, or a bucket (``s3://``, ``gs://``, any fsspec URL: `storage`), read alike.

    A file is scanned once, then only its new bytes while it grows (one ``stat`` per file when
    nothing changed); a file that shrank or was rewritten in place is scanned again. Memory is
    bounded by the largest record, as in `event_files.read_events`, and by what was found.
    A logdir that cannot be listed (several logdirs, a URL whose filesystem is not installed)
    is not checked.
    """

    def __init__(self, logdir: Optional[str]):
        self.unreadable = None  # why the logdir could not be listed when this was made
        try:
            self._root = storage.logdir_root(logdir)
        except OSError as error:  # a bucket that does not answer: TensorBoard's loader reads it
            self._root, self.unreadable = None, str(error)
            logger.warning("tensorboard-gradients cannot read the logdir itself: %s", error)
        self._files: Dict[str, file_scan.FileScan] = {}
        self._located = {}  # (run directory, tag) -> (the look it was built from, Located)
        self._signatures = {}  # run directory -> (what its files held at the last look, look)
        self._lock = threading.Lock()
        self._verifier = None  # the thread verifying checksums in the background
        self._looks = itertools.count(1)  # numbers each new look at a run (`Located.look`)
        self._not_regular = set()  # (directory, name) of non-regular files logged once
        # A bucket's segment indexes read (`segment_index`): path -> its FileState then; and
        # the segments whose index proved wrong (read from their own bytes since).
        self._indexes = {}
        self._index_refused = set()
        self._listing_failed = None  # why the logdir last could not be listed (logged once)

    def look(self, run: str) -> Optional["RunLook"]:
        """One look at the run's event files, each scanned (its new bytes) once: where its tags'
        points lie, its damage and its tags' metadata, all as of this look; None when the logdir
        is not read here (or the run not inside it)."""
        directory = self._directory(run)
        if directory is None:
            return None
        remote = storage.is_url(directory)
        regular, special = storage.event_listing(
            directory, segment_index.listed_in_bucket if remote else event_files.is_event_file)
        files = []
        with self._lock:
            indexed = self._indexed(regular) if remote else {}
            for name, path, state in regular:
                if segment_index.is_index_name(name):
                    continue
                try:
                    files.append((name, path, self._scanned(path, state, indexed.get(path))))
                except FileNotFoundError:
                    continue  # deleted since it was listed
                except OSError as error:
                    files.append((name, path, f"{name} cannot be checked: "
                                              f"{error.strerror or error}"))
            signature = tuple((path, scan.size, scan.version, scan.offset, scan.revision)
                              for _, path, scan in files if isinstance(scan, file_scan.FileScan))
            last = self._signatures.get(directory)
            if last is None or last[0] != signature:  # what the files hold changed: a new look
                last = (signature, next(self._looks))
                self._signatures[directory] = last
        return RunLook(self, run, directory, files, self._skipped(directory, special), last[1])

    def run(self, run: str) -> RunDamage:
        """What is damaged in the run's files (`RunLook.damage`)."""
        look = self.look(run)
        return NO_DAMAGE if look is None else look.damage()

    def located(self, run: str, tag: str) -> Optional[Located]:
        """Where the points of ``tag`` lie in the run's intact records (`RunLook.located`);
        None when the logdir is not read here (or the run not inside it)."""
        look = self.look(run)
        return None if look is None else look.located(tag)

    def contents(self, run: str) -> Dict[str, bytes]:
        """``{tag: metadata content}`` of this plugin's tags in the run (`RunLook.contents`)."""
        look = self.look(run)
        return {} if look is None else look.contents()

    def scan_all(self) -> None:
        """Scans every run's event files (what a request would scan first)."""
        for run in self.runs():
            self.run(run)

    @property
    def readable(self) -> bool:
        """Whether the plugin reads the logdir itself: a local directory, or a bucket prefix it
        could list when it started (else nothing is checked or located)."""
        return self._root is not None

    def runs(self):
        """The names of the logdir's runs (directories holding event files), as TensorBoard
        names them; none when the logdir is not read here."""
        if self._root is None:
            return []
        try:
            runs = sorted(run for _, run, _ in storage.walk_event_directories(
                self._root, event_files.is_event_file, None))
        except OSError as error:  # a bucket that does not answer now: no runs until it does
            if str(error) != self._listing_failed:  # once, not at every request of the tab
                logger.warning("tensorboard-gradients cannot list %s: %s",
                               storage.shown(self._root), error)
            self._listing_failed = str(error)
            return []
        if self._listing_failed is not None:
            logger.warning("tensorboard-gradients lists %s again", storage.shown(self._root))
            self._listing_failed = None
        return runs

    def _skipped(self, directory: str, special):
        """Sentences on ``special`` (``(name, what it is)`` of what ``directory`` holds named like
        an event file that is not a regular file), each also logged once (its run may have no
        tag to name it on)."""
        sentences = []
        for name, kind in special:
            sentences.append(f"{name} is {kind}, not an event file: skipped")
            if (directory, name) not in self._not_regular:
                self._not_regular.add((directory, name))
                logger.warning("tensorboard-gradients skips %s: %s, not an event file",
                               storage.join(directory, name), kind)
        return sentences

    def _directory(self, run: str) -> Optional[str]:
        """The run's directory, if it lies inside the logdir (run names are relative paths)."""
        return None if self._root is None else storage.run_directory(self._root, run)

    def _indexed(self, listed) -> Dict[str, segment_index.SegmentIndex]:
        """``{segment path: its SegmentIndex}`` from the segment indexes among ``listed`` not
        read before (hold the lock): an index is uploaded after its segments, so they are new
        in the same look (a segment scanned already needs none). One that cannot be read or
        decoded is logged and not used (its segments are read from their own bytes)."""
        new = [(name, path, state) for name, path, state in listed
               if segment_index.is_index_name(name) and self._indexes.get(path) != state]
        self._indexes.update((path, state) for _, path, state in new)
        return segment_index.in_listing(new, file_scan.index_unusable)

    def _scanned(self, path: str, state: storage.FileState,
                 indexed: Optional[segment_index.SegmentIndex] = None) -> file_scan.FileScan:
        scan = self._files.get(path)
        if scan is not None and scan.index_wrong:
            logger.warning("tensorboard-gradients: the segment index of %s does not match it: "
                           "read from its own bytes", storage.shown(path))
            self._index_refused.add(path)
            scan = file_scan.FileScan(revision=scan.revision + 1)
        elif scan is not None and (scan.size, scan.version) == state:
            if scan.unverified:
                self._start_verifier()  # again, if it stopped (the file was unreadable)
            return scan
        elif scan is None or state.size <= scan.size:  # new, shrunk or rewritten in place
            scan = file_scan.FileScan()
            if (indexed is not None and indexed.size == state.size
                    and path not in self._index_refused
                    and not file_scan.scan_index(indexed, scan)):
                scan = file_scan.FileScan()  # a tag its index cannot tell: read it whole
        if scan.broken_at is None and scan.offset < state.size:
            file_scan.scan_records(path, scan, state.size)
        # Only once scanned: a read that failed half way resumes at the last record it read.
        scan.size, scan.version = state
        self._files[path] = scan
        # A segment located from its index is verified in the background: inline, a bucket
        # run's first answer would wait for all of its segments to download.
        if scan.unverified_bytes <= VERIFY_INLINE_BYTES and scan.index is None:
            self._verify(path, scan)
        if scan.unverified:
            self._start_verifier()
        return scan

    def _verify(self, path: str, scan: file_scan.FileScan):
        """Verifies the unverified records of ``path`` now (hold the lock); left unverified, to
        try again later, when the file cannot be read now (an ``OSError``)."""
        try:
            taken = file_scan.verified(path, scan.unverified, scan.index)
        except OSError as error:
            logger.info("tensorboard-gradients will verify %s later: %s", path, error)
            return
        file_scan.settle(scan, taken, scan.unverified)

    def _start_verifier(self):
        """Starts verifying in the background unless a verifier runs (hold the lock)."""
        if self._verifier is None:
            verifier = threading.Thread(target=self._verify_in_background, daemon=True,
                                        name="tensorboard-gradients checksums")
            verifier.start()
            self._verifier = verifier

    def wait_until_verified(self, timeout: Optional[float] = None) -> bool:
        """Waits for the background verification of checksums; whether every scanned record
        is verified."""
        with self._lock:
            verifier = self._verifier
        if verifier is not None:
            verifier.join(timeout)
        with self._lock:
            return not any(scan.unverified for scan in self._files.values())

    def _verify_in_background(self):
        """Verifies the unverified records of every scanned file, `VERIFY_RECORDS` at a time,
        pausing while requests are answered. The lock is held only to take the results. A file
        that cannot be read now ends the thread: the next look at a file with records to
        verify starts it again."""
        try:
            while True:
                traffic.REQUESTS.wait_until_idle()
                with self._lock:
                    job = next(((path, scan, scan.unverified[:VERIFY_RECORDS], scan.index)
                                for path, scan in self._files.items() if scan.unverified), None)
                    if job is None:
                        self._verifier = None
                        return
                path, scan, offsets, index = job
                try:
                    taken = file_scan.verified(path, offsets, index)
                except OSError as error:
                    logger.info("tensorboard-gradients will verify %s later: %s", path, error)
                    with self._lock:
                        self._verifier = None
                    return
                with self._lock:
                    if self._files.get(path) is scan and scan.unverified[:1] == offsets[:1]:
                        file_scan.settle(scan, taken, offsets)
        except BaseException:
            with self._lock:
                self._verifier = None
            if not traffic.exiting():
                logger.exception("tensorboard-gradients could not verify the event files' "
                                 "checksums")

def shared(logdir: Optional[str]) -> EventFileIntegrity:
    """The one `EventFileIntegrity` of ``logdir`` in this process: what `prescan` read there
    is not read again when the plugin starts."""
    key = (None if not logdir else logdir.rstrip("/") if storage.is_url(logdir)
           else os.path.realpath(logdir))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = EventFileIntegrity(logdir)
        return _SHARED[key]


def prescan(logdir: str) -> bool:
    """Scans every event file of ``logdir`` in a background thread, from TensorBoard's start
    (`plugin.GradientsLoader.fix_flags`), when the plugin reads it itself (a local directory,
    a bucket: `EventFileIntegrity.readable`): TensorBoard loads its plugins seconds later, and
    the first answers on long runs need every record located. Returns whether it does."""
    checker = shared(logdir)
    if checker.readable:
        threading.Thread(target=checker.scan_all, daemon=True,
                         name="tensorboard-gradients scan").start()
    return checker.readable


_SHARED: Dict[Optional[str], EventFileIntegrity] = {}
_SHARED_LOCK = threading.Lock()
