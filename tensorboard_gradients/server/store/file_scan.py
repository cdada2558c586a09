"""One event file's records, as the plugin's scan (`event_scan`) notes them: where the points of
this plugin's tags lie, what is damaged, and the records still to verify.

A file is read from its bytes (`scan_records`: a big record located from its first bytes,
`event_files.skim_records`), or, a bucket segment its writer indexed, from its index
(`scan_index`, `format.segment_index`): the same notes either way, every record located from an
index verified afterwards against the segment's bytes (`verified`). Records failing their
checksum cost their own steps; tensors that are not what their tag's metadata says are refused
before they are ever decoded.
"""

import dataclasses
import itertools
import logging
from typing import Dict, Optional, Tuple

import numpy as np

from tensorboard_gradients.format import event_files, metadata, segment_index, storage, wire
from tensorboard_gradients.format.series import DamagedPointError, check_tensor, expected_shape
from tensorboard_gradients.server.store.source import parsed_content

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class FileScan:
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
    # The segment index the file was located from (`segment_index.SegmentIndex`: what its
    # records must be) while records are unverified; `index_wrong` once a record was found
    # otherwise: the file is then read from its own bytes.
    index: Optional[segment_index.SegmentIndex] = None
    index_wrong: bool = False


def scan_records(path: str, scan: FileScan, size: int):
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
                values = wire.tensor_values(
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
                    _note_points(record.data, (), skimmed.offset, scan)
                else:
                    _note_damaged_record(record.data, scan)
            scan.offset = skimmed.end
    scan.broken_at = framing.framing_broken_at


def scan_index(index: segment_index.SegmentIndex, scan: FileScan) -> bool:
    """Notes what a segment's index says its records hold, as `scan_records` would note it from
    the segment's bytes (an entry's payloads, which a scan never reads, are zeros here), every
    record left to verify against its bytes. False, noting nothing more, when a record holds a
    tag its segment did not describe before it (a scan would read it whole): read the segment."""
    entry_offsets = [entry.offset for entry in index.entries]
    stops = np.searchsorted(index.offsets, entry_offsets).tolist() + [len(index.offsets)]
    start = 0
    for stop, entry in zip(stops, index.entries + (None,)):
        if not _note_values(index, start, stop, scan):
            return False
        start = stop
        if entry is not None:
            try:
                compacted = entry.compacted()
            except ValueError:  # a crafted index's bytes that are no event
                return False
            _note_points(*compacted, entry.offset, scan)
    scan.unverified = sorted(index.offsets.tolist() + entry_offsets)
    scan.unverified_bytes = int(index.lengths.sum()) + sum(e.length for e in index.entries)
    scan.index, scan.offset = index, index.size
    return True


def _note_values(index: segment_index.SegmentIndex, start: int, stop: int,
                 scan: FileScan) -> bool:
    """`scan_index` for the tensor-value records ``start:stop`` of ``index``, between two
    other records: their tags are known or not for all of them alike."""
    tag_sets = index.tag_sets[start:stop]
    kinds = np.unique(tag_sets).tolist()
    found = {}
    for tag_set in kinds:
        tags = index.tags[tag_set]
        if not all(tag in scan.ours or tag in scan.others for tag in tags):
            return False
        chosen = np.flatnonzero(tag_sets == tag_set) + start
        columns = (index.steps[chosen].tolist(), index.wall_times[chosen].tolist(),
                   index.offsets[chosen].tolist())
        for position, tag in enumerate(tags):
            if tag in scan.ours:
                found.setdefault(tag, []).extend(zip(*columns, itertools.repeat(position)))
    for tag, points in found.items():
        if len(kinds) > 1:
            points.sort(key=lambda point: point[2])  # file order, as a scan notes them
        scan.points.setdefault(tag, []).extend(points)
    return True


def index_unusable(path: str, error: Exception):
    """Logs that the segment index at ``path`` cannot be read or decoded
    (`segment_index.in_listing`)."""
    logger.warning("tensorboard-gradients does not use %s (%s): its segments are read whole",
                   storage.shown(path), error)


def verified(path: str, offsets, index) -> Tuple[list, bool]:
    """What verifying the records at ``offsets`` of ``path`` takes back: ``(offset, damage)``
    for each that fails its checksum (``damage``: its data), no longer reads back whole (the
    file was cut or replaced: None) or holds an event that does not parse (False: no damage,
    as a scan reading it whole noted nothing of it); and whether one is not what the segment
    ``index`` it was located from says (None: located from the file's bytes). Reads one record
    at a time.

    Raises:
      OSError: the file cannot be read now.
    """
    taken, index_wrong = [], False
    if not offsets:
        return taken, index_wrong
    with event_files.open_regular_file(path) as file:
        for offset, record in zip(offsets, event_files.records_at(file, offsets)):
            if record is None or not record.intact:
                taken.append((offset, None if record is None else record.data))
            elif event_files.parse_event(record.data) is None:
                taken.append((offset, False))
            elif index is not None and not index.matches(offset, record.data):
                index_wrong = True
    return taken, index_wrong


def settle(scan: FileScan, verified: Tuple[list, bool], offsets):
    """The first unverified records of ``scan``, at ``offsets``, verified: what `verified`
    found taken back (`_take_back`), and they are verified no more. A segment index found
    wrong leaves the whole file to be read again from its own bytes (`_scanned`)."""
    taken, index_wrong = verified
    _take_back(scan, taken)
    del scan.unverified[:len(offsets)]
    if index_wrong:
        scan.index_wrong = True
        scan.unverified.clear()
    if not scan.unverified:
        scan.unverified_bytes, scan.index = 0, None


def _take_back(scan: FileScan, taken):
    """Takes the points of the records `verified` took back out of ``scan`` and counts their
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


def _note_points(record: bytes, content_lengths, offset: int, scan: FileScan):
    """Notes where the values of this plugin's tags in an intact record lie. A tag's first
    value with plugin metadata says whose it is; tensors logged under it before that (their
    metadata record was damaged) are kept too, as the other readers keep them.
    ``content_lengths``: per value, the length of a tensor content its segment index left out
    of ``record`` (`segment_index.Entry.compacted`; empty: the record as it is)."""
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
        refusal = _refusal(value, scan.contents.get(tag),
                           content_lengths[index] if index < len(content_lengths) else None)
        if refusal is not None:
            scan.refused.setdefault(tag, {})[int(event.step)] = refusal
            continue
        scan.points.setdefault(tag, []).append(
            (int(event.step), float(event.wall_time), offset, index))


def _refusal(value, content: Optional[bytes], content_length: Optional[int]) -> Optional[str]:
    """Why a logged value of one of this plugin's tags (first metadata ``content``; its tensor
    content left out, ``content_length`` long, or None) is refused before it is decoded, or
    None (`series.check_tensor`: the decode guard's rule)."""
    expected = _expected_shape(content)
    if expected is None:
        return None
    try:
        check_tensor(value.tensor, expected, content_length)
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


def _note_damaged_record(record: bytes, scan: FileScan):
    event = event_files.parse_event(record)
    if event is None:
        scan.unreadable += 1
        return
    for value in event.summary.value:
        scan.damaged_steps.setdefault(value.tag, set()).add(int(event.step))
