"""`Digest`: what the routes need of a run too long to hold whole, kept up to date a few
thousand logged steps at a time.

A run of 1,000 variables x 100,000 steps is 4.4 GB of statistics: neither TensorBoard nor the
plugin can hold it, and judging it takes seconds. So the plugin reads such a run's steps from
its event files (`server.store.event_scan`) in order, once, and keeps:

* the cell classes of every step (one byte per cell: 100 MB for that run) and the alerts, from
  an `analysis.AnalysisStream` (equal to judging the whole run at once);
* per stat, the heatmap `heatmap.Groups` of blocks of consecutive logged steps (a block never
  spans an epoch start), from which any overview (columns of whole blocks, or epochs) is
  merged without hiding the worst cell of any step. A block is one step at first; when there
  are more than `MAX_BLOCKS`, neighbours merge in pairs and new blocks take twice as many
  steps, so there are always between `MAX_BLOCKS / 2` and `MAX_BLOCKS` (every step of a run
  of 2,000 steps, blocks of 64 steps at 100,000): about as many columns as a screen shows,
  in bounded memory;
* the steps, their wall times and record locations, so a zoom into a few thousand steps reads
  just those steps back at full resolution (`server.answers`).

A refresh of a growing run feeds only the new steps. A run whose logged steps changed other
than by growing (a restarted job rewrote steps, an epoch mark appeared inside a summarised
block) is digested again from its first step.

The writer keeps the same digest of what it writes (`format.digest_feed`) and writes its state
as it grows (`record`: each record adds what changed since the one before), so the plugin opens
a long run by reading those records (`restored`) instead of judging every step again.
"""

import concurrent.futures
import dataclasses
import json
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis.stream import context_rows, first_kept_row
from tensorboard_gradients.analysis.heatmap import (
    NO_EPOCHS, Groups, Heatmap, NoEpochsError, step_groups,
)

# Blocks kept at most: the overview's finest columns (a screen shows 1,000-4,000); they cost
# 8 bytes per variable, stat and block (176 MB for 1,000 variables x 11 stats; up to one read's
# blocks more until they next merge in pairs).
MAX_BLOCKS = 2000
# A record's blocks are at most this many steps while they have not merged (the writer's first
# are `format.digest_feed.FIRST_BLOCK_STEPS`); merging in pairs, at most twice the steps per
# `MAX_BLOCKS`. A reader refuses more: a block's steps are what it reads back to go on.
FIRST_BLOCK_STEPS_AT_MOST = 64


class Digest:
    """The classes, alerts and per-block heatmap groups of one stats tag, fed in step order.

    Args:
      like: a `GradientSeries` (any rows) with the tag's variables, layers, shapes and stats.
      thresholds: the `analysis.Thresholds` the classes and alerts follow.
      epoch_starts, epoch_indices: the steps where epochs start (blocks are cut there) and
        their epoch indices, or None.
      block_steps: logged steps per block at first (the writer's digest starts coarser).
    """

    def __init__(self, like, thresholds: analysis.Thresholds, epoch_starts=None,
                 epoch_indices=None, block_steps: int = 1):
        self.like = like
        self.thresholds = thresholds
        self.stats = tuple(like.available_stats)
        self.set_epochs(epoch_starts, epoch_indices)
        self._stream = analysis.AnalysisStream(like, thresholds)
        self._steps = _Rows(np.int64)
        self._wall_times = _Rows(np.float64)
        self._classes = _Rows(np.int8, len(like.variables))  # final rows
        # The logged values [rows, variables, logged stats] of rows not in a block yet.
        self._pending: List[np.ndarray] = []
        self._pending_from = 0  # the row of its first row
        # The `Groups` of whole blocks: worst [blocks, variables], total and count [blocks,
        # variables, stats], kept in float32 (a block's sum of float32 statistics needs no more
        # to be shown) and merged in place.
        self._new_blocks()
        self._block_starts = [0]  # rows where summarised blocks start, and the end of the last
        self.block_steps = block_steps  # logged steps per new block (fewer at epoch starts)

    def set_epochs(self, starts, indices):
        """The epoch marks: ``starts`` (steps) and their epoch ``indices``, or None."""
        self.epoch_starts = np.asarray(() if starts is None else starts, np.int64)
        self.epoch_indices = np.asarray(() if indices is None else indices, np.int64)

    @property
    def rows(self) -> int:
        return self._stream.rows

    def feed(self, rows, alongside: Optional[concurrent.futures.Executor] = None) -> None:
        """Adds the next logged steps (a `GradientSeries` of rows after every row fed so far).

        ``alongside``: an executor (of one worker) in which the rows already judged are
        summarised into blocks while these are judged (numpy lets the two share the CPU); the
        rows judged now then wait for the next feed, or for `summarise`."""
        if not len(rows.steps):
            return
        cuts = self._block_cuts(self._pending_from, self._stream.final_rows)
        summarising = (alongside.submit(self._summarise, cuts)
                       if alongside is not None and len(cuts) > 1 else None)
        try:  # the summary reads only rows already final, and nothing the stream changes
            final = self._stream.feed_rows(rows)
        finally:
            if summarising is not None:
                summarising.result()
        self._classes.extend(final)
        self._steps.extend(rows.steps)
        self._wall_times.extend(rows.wall_times)
        self._pending.append(rows.values)
        if alongside is None:
            self.summarise()

    def summarise(self):
        """Turns the pending rows whose classes are final into whole blocks."""
        self._summarise(self._block_cuts(self._pending_from, self._stream.final_rows))

    def _summarise(self, cuts: List[int]):
        """Turns the pending rows ``cuts[0]:cuts[-1]`` into the blocks between ``cuts``."""
        if len(cuts) < 2:
            return
        self._add_blocks(self._groups_of(cuts))  # joins the pending rows into one array
        self._block_starts.extend(cuts[1:])
        self._pending = [self._pending[0][cuts[-1] - self._pending_from:]]
        self._pending_from = cuts[-1]
        while len(self._block_starts) - 1 > MAX_BLOCKS and self._merge_pairs():
            pass

    def _merge_pairs(self) -> bool:
        """Merges neighbouring blocks in pairs (never across an epoch start); later blocks
        take twice as many steps. False when no two blocks could merge (every block is an
        epoch: a run of more than `MAX_BLOCKS` epochs keeps a block per epoch)."""
        starts = self._block_starts
        epoch_rows = set(np.searchsorted(self.steps(), self.epoch_starts).tolist())
        kept, block = [], 0
        while block < len(starts) - 1:
            kept.append(block)
            pair = block + 1 < len(starts) - 1 and starts[block + 1] not in epoch_rows
            block += 2 if pair else 1
        if len(kept) == len(starts) - 1:
            return False
        merged = self._blocks().merged(np.asarray(kept), np.float32)
        self._new_blocks(capacity=len(kept))  # the room blocks of one step took is given back
        self._add_blocks(merged)
        self._block_starts = [starts[i] for i in kept] + [starts[-1]]
        self.block_steps *= 2
        return True

    def _groups_of(self, cuts: List[int]) -> Groups:
        """The `Groups` (every stat) of the pending rows' blocks ``cuts[i]:cuts[i + 1]``."""
        if len(self._pending) > 1:
            self._pending = [np.concatenate(self._pending)]
        values = self._pending[0][:cuts[-1] - self._pending_from]
        classes = self.classes(cuts[0], cuts[-1])
        starts = np.asarray(cuts[:-1], dtype=np.int64) - cuts[0]
        derived = self.stats[len(self.like.stat_names):]
        if derived:
            piece = dataclasses.replace(self.like, values=values)
            values = np.concatenate(
                [values, np.stack([piece.stat(name) for name in derived], axis=-1)], axis=-1)
        return Groups.of_steps(values, classes).merged(starts, np.float32)

    def _blocks(self) -> Groups:
        """The whole blocks' `Groups` (views: valid until blocks are next added or merged)."""
        return Groups(self._worst.view(), self._total.view(), self._count.view())

    def _new_blocks(self, capacity: int = MAX_BLOCKS):
        width = (len(self.like.variables), len(self.stats))
        self._worst = _Rows(np.int8, width[0], capacity=capacity)
        self._total = _Rows(np.float32, *width, capacity=capacity)
        self._count = _Rows(np.int32, *width, capacity=capacity)

    def _add_blocks(self, groups: Groups):
        """Appends blocks (copied: blocks of one step would otherwise keep the piece read)."""
        self._worst.extend(groups.worst)
        self._total.extend(groups.total)
        self._count.extend(groups.count)

    def _block_cuts(self, start: int, stop: int, partial: bool = False) -> List[int]:
        """Row boundaries of the blocks in rows ``[start, stop)``, starting with ``start``:
        every `block_steps` rows and at every epoch start. Rows after the last whole block are
        left out, unless ``partial`` (then ``stop`` is the last boundary)."""
        epoch_rows = np.searchsorted(self.steps(), self.epoch_starts)
        cuts = [start]
        while cuts[-1] < stop:
            size = self.block_steps
            later = epoch_rows[(epoch_rows > cuts[-1]) & (epoch_rows < cuts[-1] + size)]
            end = int(later.min()) if later.size else cuts[-1] + size
            if end > stop:
                if partial:
                    cuts.append(stop)
                break
            cuts.append(end)
        return cuts

    def steps(self) -> np.ndarray:
        return self._steps.view()

    def wall_times(self) -> np.ndarray:
        return self._wall_times.view()

    def classes(self, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """``int8[rows, variables]``: the classes of rows ``start:stop`` (the last few rows of
        the run are provisional: later steps may still change them)."""
        stop = self.rows if stop is None else stop
        final = self._classes.view()
        if stop <= len(final):
            return final[start:stop]
        provisional = self._stream.provisional_classes()[max(0, start - len(final)):
                                                          stop - len(final)]
        return np.concatenate([final[start:], provisional]) if start < len(final) else provisional

    def alerts(self) -> List[analysis.Alert]:
        return self._stream.alerts()

    def overview(self, stat: str, max_columns: int, row_range: Optional[Sequence[int]] = None,
                 by_epoch: bool = False):
        """The heatmap of ``stat`` from whole blocks (the last, unfinished one too): columns of
        whole blocks, at most ``max_columns``, of the blocks overlapping rows ``row_range =
        (first, stop)`` (None: all rows). ``by_epoch``: one column per epoch (blocks never span
        an epoch start), labelled by the step where its epoch starts, as `heatmap.build` does;
        `heatmap.NoEpochsError` without epoch marks.

        Returns (`Heatmap`, the row where each column starts)."""
        if by_epoch and not len(self.epoch_starts):
            raise NoEpochsError(NO_EPOCHS)
        groups, starts = self._block_groups(stat)
        if row_range is not None:
            first = max(0, int(np.searchsorted(starts, row_range[0], "right")) - 1)
            last = max(first, int(np.searchsorted(starts, row_range[1], "left")))
            groups = Groups(groups.worst[first:last], groups.total[first:last],
                            groups.count[first:last])
            starts = starts[first:last + 1]
        steps, wall_times = self.steps(), self.wall_times()
        block_rows = starts[:-1]
        epoch_index = None
        if by_epoch and len(block_rows):
            # Steps before the first mark belong to the first epoch (`heatmap.epoch_groups`).
            marks = np.maximum(np.searchsorted(self.epoch_starts, steps[block_rows], "right") - 1,
                               0)
            columns = np.flatnonzero(np.append(True, marks[1:] != marks[:-1]))
            columns = columns[step_groups(len(columns), max_columns)]
            epoch_index = self.epoch_indices[marks[columns]]
        else:
            columns = step_groups(len(block_rows), max_columns)
            epoch_index = np.zeros(0, np.int64) if by_epoch else None
        if not len(columns):
            empty = np.zeros((len(self.like.variables), 0))
            return Heatmap(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), empty,
                           empty.astype(np.int8), epoch_index, True), columns
        merged = groups.merged(columns)
        column_rows = block_rows[columns]
        ends = np.append(starts[columns[1:]], starts[-1]) - 1
        column_steps = (self.epoch_starts[marks[columns]] if by_epoch else steps[column_rows])
        return Heatmap(
            steps=column_steps, last_steps=steps[ends], wall_times=wall_times[column_rows],
            values=merged.values().T, classes=merged.worst.T, epoch_index=epoch_index,
            downsampled=True,
        ), column_rows

    def record(self, since: "Written") -> Tuple[Dict[str, np.ndarray], "Written"]:
        """(what a digest record holds, how much is then written): since the records written
        before (``since``), the steps of the rows fed and the classes that became final; the
        blocks made since (`BLOCK_ARRAYS`: all of them once blocks merged since, so a reader
        needs them only from the last such record on); and as of now: the groups of the rows
        not in a whole block yet (``tail_*``), the alerts, and the analysis stream's state to go
        on elsewhere, its provisional classes among it (`AnalysisStream.state`). Call after
        `summarise` (`metadata.encode_digest` writes it)."""
        final = self._classes.view()
        blocks = self._blocks()
        first_block = since.blocks if since.block_steps == self.block_steps else 0
        tail, cuts = self._tail()
        if tail is None:
            tail = Groups(*(np.zeros((0,) + array.shape[1:], array.dtype)
                            for array in (blocks.worst, blocks.total, blocks.count)))
        arrays = {
            "first_row": np.int64(since.rows), "steps": self.steps()[since.rows:],
            "final_from": np.int64(since.final_rows), "classes": final[since.final_rows:],
            "block_steps": np.int64(self.block_steps), "first_block": np.int64(first_block),
            "block_starts": np.asarray(self._block_starts[first_block:], np.int64),
            "worst": blocks.worst[first_block:], "total": blocks.total[first_block:],
            "count": blocks.count[first_block:],
            "tail_starts": np.asarray(cuts, np.int64), "tail_worst": tail.worst,
            "tail_total": tail.total, "tail_count": tail.count,
            "epoch_starts": self.epoch_starts, "alerts": _alerts_json(self.alerts()),
            **self._stream.state(since.final_rows),
        }
        return arrays, Written(self.rows, len(final), len(blocks.worst), self.block_steps)

    @classmethod
    def restored(cls, like, thresholds: analysis.Thresholds, records, wall_times,
                 epoch_starts=None, epoch_indices=None) -> "WrittenDigest":
        """The digest that a writer's ``records`` (`record`'s dicts in the order written, up to
        the first that does not follow the ones before) describe, under ``thresholds``;
        read-only (it takes no more steps: see `continued`). Records before the last one whose
        blocks start at the first may leave out their `BLOCK_ARRAYS`. ``wall_times``: of the
        run's rows (at least those they cover).

        Raises:
          ValueError: as `chained`; no record follows from the first step; or the records cut
            blocks at other epoch starts than ``epoch_starts`` or do not hold what they say.
        """
        read = _Records.read(like, thresholds, records, wall_times, epoch_starts)
        last = read.used[-1]
        alerts = [analysis.Alert(**alert) for alert in json.loads(last["alerts"].tobytes())]
        written = WrittenDigest(
            like, thresholds, read.epoch_starts, epoch_indices, steps=read.steps,
            wall_times=wall_times[:len(read.steps)],
            classes=read.classes + [last["stream_provisional_classes"]], blocks=read.blocks,
            block_starts=read.block_starts + read.tail_starts[1:], block_steps=read.block_steps,
            tail=read.tail, alerts=alerts)
        written.records = read.used  # their arrays are its parts: kept at no cost
        return written

    @classmethod
    def continued(cls, like, thresholds: analysis.Thresholds, records, wall_times, rows_of,
                  epoch_starts=None, epoch_indices=None) -> "Digest":
        """The digest that ``records`` describe (as `restored`), able to take the steps that
        follow them: the writer's digest goes on in another process (a restarted job's steps
        cost only those steps). ``rows_of(start, stop)`` reads the run's rows back (a
        `GradientSeries`): the few the writer had not yet put in a block or still looked back
        on.

        Raises:
          ValueError: as `restored`; or the records hold no state to go on from (written by a
            version that did not write it), or the rows read back are not the records' rows.
        """
        read = _Records.read(like, thresholds, records, wall_times, epoch_starts)
        last = read.used[-1]
        if "stream_rows" not in last:
            raise ValueError("the digest records hold no state to go on from")
        rows, final_rows = len(read.steps), sum(len(part) for part in read.classes)
        pending_from = read.block_starts[-1]
        start = min(int(last["stream_kept_from"]), pending_from)
        # Checked before any row is read back: a writer leaves fewer rows than a block, and the
        # rules' windows, out of its blocks (a crafted record must not make it read the run).
        if (int(last["stream_rows"]) != rows or int(last["stream_final_rows"]) != final_rows
                or not 0 <= final_rows - pending_from < read.block_steps
                or rows - final_rows > context_rows(thresholds, like.stats_every)
                or int(last["stream_kept_from"]) != first_kept_row(final_rows, thresholds,
                                                                   like.stats_every)):
            raise ValueError("the digest records' state does not fit their rows")
        again = rows_of(start, rows)
        if not np.array_equal(again.steps, read.steps[start:]):
            raise ValueError("the rows read back are not the digest records' rows")
        digest = cls(like, thresholds, read.epoch_starts, epoch_indices, read.block_steps)
        kept = again.at_rows(slice(int(last["stream_kept_from"]) - start, None))
        digest._stream = analysis.AnalysisStream.resumed(like, thresholds, read.used, kept,
                                                         read.steps)
        digest._steps.extend(read.steps)
        digest._wall_times.extend(wall_times[:rows])
        # Room for every row at once (the classes of 1,000 x 100,000 are 100 MB).
        digest._classes = _Rows(np.int8, len(like.variables), capacity=rows)
        for part in read.classes:
            digest._classes.extend(part)
        for part in read.blocks:
            digest._add_blocks(part)
        digest._block_starts = list(read.block_starts)
        digest._pending = [again.values[pending_from - start:]]
        digest._pending_from = pending_from
        return digest

    def _block_groups(self, stat: str):
        """(`Groups` of every block of ``stat``, the unfinished ones at the end too; the rows
        where blocks start, with the end appended)."""
        position = self.stats.index(stat)
        tail, cuts = self._tail()
        parts = [self._blocks().stat(position)] + ([tail.stat(position)] if tail else [])
        return (Groups.concatenated(parts),
                np.asarray(self._block_starts + cuts[1:], dtype=np.int64))

    def _tail(self):
        """(the `Groups` of the rows not in a whole block yet, in blocks, or None; the rows
        where those blocks start, from the end of the whole ones, with the end appended)."""
        if self.rows == self._pending_from:
            return None, [self._pending_from]
        cuts = self._block_cuts(self._pending_from, self.rows, partial=True)
        return self._groups_of(cuts), cuts


# The arrays of a record that hold its blocks: a reader reads them from the last record whose
# blocks start at the first (``first_block`` 0) on, and the other arrays of every record.
BLOCK_ARRAYS = ("first_block", "block_steps", "block_starts", "worst", "total", "count")


@dataclasses.dataclass(frozen=True)
class Written:
    """How much of a digest the records written so far hold (see `Digest.record`)."""

    rows: int = 0
    final_rows: int = 0
    blocks: int = 0
    block_steps: int = 0


@dataclasses.dataclass
class _Records:
    """A writer's records read and checked (`Digest.restored`, `Digest.continued`): the steps
    and final classes of every row, the whole blocks, the tail's groups, the records used."""

    used: list
    steps: np.ndarray
    classes: list  # the final classes, a part per record
    blocks: list  # `Groups` parts of the whole blocks
    block_starts: list  # where whole blocks start, with the end of the last appended
    block_steps: int
    tail: Groups
    tail_starts: list
    epoch_starts: np.ndarray

    @classmethod
    def read(cls, like, thresholds, records, wall_times, epoch_starts) -> "_Records":
        steps, classes, blocks, block_starts = [], [], None, [0]
        written = Written()
        used = records[:chained(records, thresholds)]
        for record in used:
            block_steps = written.block_steps
            if "worst" in record:  # the records before the last that wrote every block: none
                first_block, block_steps = int(record["first_block"]), int(record["block_steps"])
                if not first_block:
                    blocks, block_starts = [], [0]
                elif (blocks is None or first_block != written.blocks
                      or block_steps != written.block_steps):
                    raise ValueError("the digest records' blocks do not follow one another")
                blocks.append(Groups(record["worst"], record["total"], record["count"]))
                block_starts = block_starts[:-1] + record["block_starts"].tolist()
            steps.append(record["steps"])
            classes.append(record["classes"])
            written = Written(written.rows + len(record["steps"]),
                              written.final_rows + len(record["classes"]),
                              len(block_starts) - 1, block_steps)
        if not written.rows:
            raise ValueError("no digest record of this analysis follows from the first step")
        if blocks is None:
            raise ValueError("no digest record holds the blocks")
        last = used[-1]
        steps = np.concatenate(steps)
        marks = np.asarray(last["epoch_starts"], np.int64)
        epoch_starts = np.asarray(() if epoch_starts is None else epoch_starts, np.int64)
        if not np.array_equal(marks[marks <= steps[-1]], epoch_starts[epoch_starts <= steps[-1]]):
            raise ValueError("the digest records cut blocks at other epoch starts")
        tail = Groups(last["tail_worst"], last["tail_total"], last["tail_count"])
        tail_starts = last["tail_starts"].tolist()
        width = (len(like.variables), len(like.available_stats))
        if (len(wall_times) < written.rows
                or not 1 <= block_steps <= max(FIRST_BLOCK_STEPS_AT_MOST,
                                               2 * written.rows // MAX_BLOCKS + 2)
                or any(part.size and not 0 <= part.min() <= part.max() < len(analysis.CLASSES)
                       for part in classes + [last["stream_provisional_classes"]])
                or len(last["stream_provisional_classes"]) != written.rows - written.final_rows
                or len(block_starts) - 1 != sum(len(part.worst) for part in blocks)
                or [block_starts[-1], written.rows] != [tail_starts[0], tail_starts[-1]]
                or len(tail_starts) - 1 != len(tail.worst) or not _whole(tail, width)
                or not all(_whole(part, width) for part in blocks)
                or (np.diff(np.asarray(block_starts + tail_starts[1:])) <= 0).any()
                or any(part.ndim != 2 or part.shape[1] != width[0] or part.dtype.kind not in "iu"
                       for part in classes + [last["stream_provisional_classes"]])):
            raise ValueError("the digest records do not hold what they say")
        return cls(used, steps, classes, blocks, block_starts, block_steps, tail, tail_starts,
                   epoch_starts)


def _whole(groups: Groups, width) -> bool:
    """Whether read ``groups`` are blocks of ``width`` (variables, stats): shapes and kinds."""
    blocks = len(groups.worst)
    return (groups.worst.shape == (blocks, width[0]) and groups.worst.dtype.kind in "iu"
            and groups.total.shape == (blocks,) + tuple(width)
            and groups.count.shape == groups.total.shape and groups.count.dtype.kind in "iu"
            and groups.total.dtype.kind == "f")


def chained(records, thresholds: analysis.Thresholds) -> int:
    """How many of ``records`` (in step order) follow one another from the first step, written
    by the writer of the first (``writer``: a random id per digest; a restarted job's records
    do not follow another job's) under ``thresholds`` and this version's analysis.

    Raises:
      ValueError: a record among them voids the records before it (`format.digest_feed`).
    """
    identity = analysis_identity(thresholds)
    rows = final_rows = 0
    for count, record in enumerate(records):
        if "void" in record:
            raise ValueError("the writer voided its digest")
        if (int(record["first_row"]) != rows or int(record["final_from"]) != final_rows
                or not np.array_equal(record["analysis"], identity)
                or not np.array_equal(record["writer"], records[0]["writer"])):
            return count
        rows += len(record["steps"])
        final_rows += len(record["classes"])
    return len(records)


def analysis_identity(thresholds: analysis.Thresholds) -> np.ndarray:
    """What a digest's classes and alerts follow: this package's version and its rules'
    revision (`analysis.RULES_REVISION`) and the thresholds, as a record's ``analysis`` array (a
    reader uses a record only if it matches)."""
    from tensorboard_gradients import __version__

    text = json.dumps({"version": __version__, "rules": analysis.RULES_REVISION,
                       "thresholds": dataclasses.asdict(thresholds)}, sort_keys=True)
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _alerts_json(alerts) -> np.ndarray:
    text = json.dumps([alert.to_json() for alert in alerts], separators=(",", ":"))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


class WrittenDigest(Digest):
    """A digest as a writer's records left it (`Digest.restored`): read-only, and its parts
    kept as they were read (copying 100 MB of classes and 70 MB of blocks would cost a second).

    ``classes``: the parts of the rows' classes in order (the provisional ones last);
    ``blocks``: the `Groups` parts of the whole blocks; ``tail``: of the blocks after them;
    ``block_starts``: where each block starts, whole and tail, with the end appended."""

    def __init__(self, like, thresholds, epoch_starts, epoch_indices, *, steps, wall_times,
                 classes, blocks, block_starts, block_steps, tail, alerts):
        super().__init__(like, thresholds, epoch_starts, epoch_indices, block_steps)
        self._steps.extend(steps)
        self._wall_times.extend(wall_times)
        self._class_parts = classes
        self._class_ends = np.cumsum([len(part) for part in classes])
        self._block_parts = blocks + ([tail] if len(tail.worst) else [])
        self._block_starts = block_starts
        self._written_alerts = alerts
        # (first row, end row, file) of each record, set by its reader (`server.store.local_tag`)
        self.sources = []
        self.records = []  # the records used, in order (`Digest.continued` goes on from them)
        self.continues = None  # False once `Digest.continued` failed on them

    @property
    def rows(self) -> int:
        return len(self._steps.view())

    def feed(self, rows, alongside=None):
        raise TypeError("a digest restored from its records takes no more steps")

    def classes(self, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        stop = self.rows if stop is None else stop
        parts, begin = [], 0
        for part, end in zip(self._class_parts, self._class_ends):
            if end > start and begin < stop:
                parts.append(part[max(start - begin, 0):stop - begin])
            begin = end
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.like.variables)), np.int8)

    def alerts(self) -> List[analysis.Alert]:
        return list(self._written_alerts)

    def _block_groups(self, stat: str):
        position = self.stats.index(stat)
        return (Groups.concatenated(part.stat(position) for part in self._block_parts),
                np.asarray(self._block_starts, dtype=np.int64))


class _Rows:
    """A growing array of rows (amortised appends, no copy on read)."""

    def __init__(self, dtype, *width, capacity: int = 1024):
        self._array = np.zeros((max(capacity, 1),) + width, dtype=dtype)
        self._count = 0

    def extend(self, rows):
        rows = np.asarray(rows, dtype=self._array.dtype)
        needed = self._count + len(rows)
        if needed > len(self._array):
            grown = np.zeros((max(needed, 2 * len(self._array)),) + self._array.shape[1:],
                             dtype=self._array.dtype)
            grown[:self._count] = self._array[:self._count]
            self._array = grown
        self._array[self._count:needed] = rows
        self._count = needed

    def view(self) -> np.ndarray:
        return self._array[:self._count]
