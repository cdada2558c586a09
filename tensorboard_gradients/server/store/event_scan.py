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
(reading it back finds it damaged) and not yet counted as damage.
"""

import dataclasses
import itertools
import logging
import os
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from tensorboard_gradients.format import event_files, metadata, storage
from tensorboard_gradients.format.series import DamagedPointError, check_tensor, expected_shape
from tensorboard_gradients.server.store import traffic
from tensorboard_gradients.server.store.damage import NO_DAMAGE, RunDamage, counted
from tensorboard_gradients.server.store.source import parsed_content

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _FileScan:
    """What the records of one event file told so far; the next scan resumes at `offset`."""

    size: int = -1
    version: object = None  # `storage.FileState.version`: a local file's mtime
    offset: int = 0
    damaged_steps: Dict[str, set] = dataclasses.field(default_factory=dict)  # tag -> steps
    # tag -> {step: why} of intact records whose tensor is not what the tag's metadata says (a
    # "bomb" declaring terabytes, a string tensor): never located, counted as damage.
    refused: Dict[str, dict] = dataclasses.field(default_factory=dict)
    unreadable: int = 0  # records failing their checksum that do not parse either
    broken_at: Optional[int] = None  # a record length failing its checksum: nothing after it
    # This plugin's tags in this file and the other tags (by their first value with plugin
    # metadata), and per tag its points: [(step, wall_time, offset, value index)].
    ours: set = dataclasses.field(default_factory=set)
    others: set = dataclasses.field(default_factory=set)
    points: Dict[str, list] = dataclasses.field(default_factory=dict)
    contents: Dict[str, bytes] = dataclasses.field(default_factory=dict)  # first metadata
    # Offsets of the records located from their first bytes whose data checksum is not verified
    # yet, in file order, and how many data bytes they hold.
    unverified: list = dataclasses.field(default_factory=list)
    unverified_bytes: int = 0
    revision: int = 0  # bumped when a verification took points back


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
        self._files = files  # (name, path, its _FileScan or why it cannot be checked)
        self._skipped = skipped
        self.number = number  # equal numbers: the files held the same
        self._by_tag = None  # tag -> the (path, scan) holding points of it
        self._damage = None

    def _scans(self):
        return [(name, path, scan) for name, path, scan in self._files
                if isinstance(scan, _FileScan)]

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
                if not isinstance(scan, _FileScan):
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
        self._files: Dict[str, _FileScan] = {}
        self._located = {}  # (run directory, tag) -> (the look it was built from, Located)
        self._signatures = {}  # run directory -> (what its files held at the last look, look)
        self._lock = threading.Lock()
        self._verifier = None  # the thread verifying checksums in the background
        self._looks = itertools.count(1)  # numbers each new look at a run (`Located.look`)
        self._not_regular = set()  # (directory, name) of non-regular files logged once

    def look(self, run: str) -> Optional["RunLook"]:
        """One look at the run's event files, each scanned (its new bytes) once: where its tags'
        points lie, its damage and its tags' metadata, all as of this look; None when the logdir
        is not read here (or the run not inside it)."""
        directory = self._directory(run)
        if directory is None:
            return None
        regular, special = storage.event_listing(directory, event_files.is_event_file)
        files = []
        with self._lock:
            for name, path, state in regular:
                try:
                    files.append((name, path, self._scanned(path, state)))
                except FileNotFoundError:
                    continue  # deleted since it was listed
                except OSError as error:
                    files.append((name, path, f"{name} cannot be checked: "
                                              f"{error.strerror or error}"))
            signature = tuple((path, scan.size, scan.version, scan.offset, scan.revision)
                              for _, path, scan in files if isinstance(scan, _FileScan))
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
            return sorted(run for _, run, _ in storage.walk_event_directories(
                self._root, event_files.is_event_file, None))
        except OSError as error:  # a bucket that does not answer now: no runs until it does
            logger.warning("tensorboard-gradients cannot list %s: %s", storage.shown(self._root),
                           error)
            return []

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

    def _scanned(self, path: str, state: storage.FileState) -> _FileScan:
        scan = self._files.get(path)
        if scan is not None and (scan.size, scan.version) == state:
            if scan.unverified:
                self._start_verifier()  # again, if it stopped (the file was unreadable)
            return scan
        if scan is None or state.size <= scan.size:  # new, shrunk or rewritten in place
            scan = _FileScan()
        if scan.broken_at is None:
            _scan_records(path, scan, state.size)
        # Only once scanned: a read that failed half way resumes at the last record it read.
        scan.size, scan.version = state
        self._files[path] = scan
        if scan.unverified_bytes <= VERIFY_INLINE_BYTES:
            self._verify(path, scan)
        if scan.unverified:
            self._start_verifier()
        return scan

    def _verify(self, path: str, scan: _FileScan):
        """Verifies the unverified records of ``path`` now (hold the lock); left unverified, to
        try again later, when the file cannot be read now (an ``OSError``)."""
        try:
            taken = _verified(path, scan.unverified)
        except OSError as error:
            logger.info("tensorboard-gradients will verify %s later: %s", path, error)
            return
        _settle(scan, taken, len(scan.unverified))

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
                    job = next(((path, scan, scan.unverified[:VERIFY_RECORDS])
                                for path, scan in self._files.items() if scan.unverified), None)
                    if job is None:
                        self._verifier = None
                        return
                path, scan, offsets = job
                try:
                    taken = _verified(path, offsets)
                except OSError as error:
                    logger.info("tensorboard-gradients will verify %s later: %s", path, error)
                    with self._lock:
                        self._verifier = None
                    return
                with self._lock:
                    if self._files.get(path) is scan and scan.unverified[:1] == offsets[:1]:
                        _settle(scan, taken, len(offsets))
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


def _scan_records(path: str, scan: _FileScan, size: int):
    """Reads ``path`` from ``scan.offset`` to ``size``, noting where this plugin's points lie and
    the records failing their checksum; a record still being written is left for the next
    scan. A big record that is one tensor value of a tag already known is located from its
    first bytes and left to verify (``scan.unverified``); any other is read whole."""
    framing = event_files.ReadDamage()
    with event_files.open_regular_file(path) as file:
        for skimmed in event_files.skim_records(file, scan.offset, size, framing):
            record = skimmed.record
            if record is None:
                data_at = skimmed.data_offset
                values = event_files.tensor_values(
                    skimmed.head, skimmed.length,
                    lambda at, count: storage.read_at(file, data_at + at, count))
                # Tags already known (a new one is known by its metadata: read whole).
                if values is not None and all(tag in scan.ours or tag in scan.others
                                              for tag in values[2]):
                    wall_time, step, tags = values
                    for index, tag in enumerate(tags):
                        if tag in scan.ours:
                            scan.points.setdefault(tag, []).append(
                                (step, wall_time, skimmed.offset, index))
                    scan.unverified.append(skimmed.offset)
                    scan.unverified_bytes += skimmed.length
                    scan.offset = skimmed.end
                    continue
                (record,) = event_files.records_at(file, (skimmed.offset,))
                if record is None:
                    break  # truncated while being read: the next scan resumes here
            if record is not None:
                if record.intact:
                    _note_points(record.data, skimmed.offset, scan)
                else:
                    _note_damaged_record(record.data, scan)
            scan.offset = skimmed.end
    scan.broken_at = framing.framing_broken_at


def _verified(path: str, offsets) -> list:
    """What verifying the records at ``offsets`` of ``path`` takes back: ``(offset, damage)``
    for each that fails its checksum (``damage``: its data), no longer reads back whole (the
    file was cut or replaced: None) or holds an event that does not parse (False: no damage,
    as a scan reading it whole noted nothing of it). Reads one record at a time.

    Raises:
      OSError: the file cannot be read now.
    """
    taken = []
    if not offsets:
        return taken
    with event_files.open_regular_file(path) as file:
        for offset, record in zip(offsets, event_files.records_at(file, offsets)):
            if record is None or not record.intact:
                taken.append((offset, None if record is None else record.data))
            elif event_files.parse_event(record.data) is None:
                taken.append((offset, False))
    return taken


def _settle(scan: _FileScan, taken, count: int):
    """The first ``count`` unverified records of ``scan`` verified: what `_verified` found
    taken back (`_take_back`), and they are verified no more."""
    _take_back(scan, taken)
    del scan.unverified[:count]
    if not scan.unverified:
        scan.unverified_bytes = 0


def _take_back(scan: _FileScan, taken):
    """Takes the points of the records `_verified` took back out of ``scan`` and counts their
    damage, as if the scan had read them whole."""
    if not taken:
        return
    offsets = {offset for offset, _ in taken}
    for tag, points in scan.points.items():
        scan.points[tag] = [point for point in points if point[2] not in offsets]
    for _, damage in taken:
        if damage is None:
            scan.unreadable += 1
        elif damage is not False:
            _note_damaged_record(damage, scan)
    scan.revision += 1


# Unverified bytes a scan verifies before it returns (a short run's, or a long run's latest
# steps); more are verified in the background, `VERIFY_RECORDS` at a time (~45 MB for 1,000
# variables).
VERIFY_INLINE_BYTES = 64 * 1024 * 1024
VERIFY_RECORDS = 200


def _note_points(record: bytes, offset: int, scan: _FileScan):
    """Notes where the values of this plugin's tags in an intact record lie. A tag's first
    value with plugin metadata says whose it is; tensors logged under it before that (their
    metadata record was damaged) are kept too, as the other readers keep them."""
    event = event_files.parse_event(record)
    if event is None:
        return
    for index, value in enumerate(event.summary.value):
        tag = value.tag
        if tag in _LOSS_SCALARS and tag not in scan.ours and not (
                value.metadata.plugin_data.plugin_name in _OURS):
            # A run's own loss scalar: the loss where no monitor logged it (read as a scalar,
            # `reader.scalar_value`, never as one of this plugin's tensors).
            scan.points.setdefault(tag, []).append(
                (int(event.step), float(event.wall_time), offset, index))
            continue
        if tag in scan.others:
            continue
        if tag not in scan.ours:
            plugin_data = value.metadata.plugin_data
            if plugin_data.plugin_name in _OURS:
                scan.ours.add(tag)
                scan.contents[tag] = plugin_data.content
            elif plugin_data.plugin_name or not value.HasField("tensor"):
                scan.others.add(tag)
                scan.points.pop(tag, None)
                continue
        refusal = _refusal(value, scan.contents.get(tag))
        if refusal is not None:
            scan.refused.setdefault(tag, {})[int(event.step)] = refusal
            continue
        scan.points.setdefault(tag, []).append(
            (int(event.step), float(event.wall_time), offset, index))


def _refusal(value, content: Optional[bytes]) -> Optional[str]:
    """Why a logged value of one of this plugin's tags (first metadata ``content``) is refused
    before it is decoded, or None (`series.check_tensor`: the decode guard's rule)."""
    expected = _expected_shape(content)
    if expected is None:
        return None
    try:
        check_tensor(value.tensor, expected)
    except DamagedPointError as error:
        return str(error)
    return None


def _expected_shape(content: Optional[bytes]):
    """The shape a tag's logged tensors must have, None when its metadata does not say (the
    writer's digests, metadata that does not parse: reported with the tag)."""
    parsed = None if content is None else parsed_content(content).parsed
    if parsed is None or parsed.kind not in (metadata.KIND_STATS, metadata.KIND_HISTOGRAMS,
                                             metadata.KIND_EPOCHS, metadata.KIND_LOSS):
        return None
    return expected_shape(parsed)


# This plugin's tags: its statistics and the writer's digests of them (`format.digest_feed`).
_OURS = (metadata.PLUGIN_NAME, metadata.DIGEST_PLUGIN_NAME)
_LOSS_SCALARS = frozenset(metadata.LOSS_SCALARS)


def _note_damaged_record(record: bytes, scan: _FileScan):
    event = event_files.parse_event(record)
    if event is None:
        scan.unreadable += 1
        return
    for value in event.summary.value:
        scan.damaged_steps.setdefault(value.tag, set()).add(int(event.step))
