"""A long run's digest (`analysis.digest`), fed a few steps at a time, serves the overview the
never-hide-the-worst merge gives on every step read so far: with blocks merged in place, epoch
cuts, and the blocks summarised in a second thread while the next steps are judged."""

import concurrent.futures
import dataclasses

import numpy as np
import pytest

from test_analysis_stream import random_series
from tensorboard_gradients.format import metadata
from tensorboard_gradients.analysis import digest, heatmap
from tensorboard_gradients.analysis.stream import context_rows


def _piece(series, start, stop):
    return series.at_rows(slice(start, stop))


def _random_epochs(series, random):
    """Epoch marks at random steps of ``series`` (half the time none): (starts, indices)."""
    if not len(series.steps) or random.random() < 0.5:
        return None, None
    starts = np.unique(random.choice(series.steps, size=int(random.integers(1, 10))))
    return starts, np.arange(len(starts))


def _record(fed, written, thresholds, writer):
    """(``fed``'s next record as a reader reads it back, how much is then written)."""
    arrays, written = fed.record(written)
    arrays["analysis"] = digest.analysis_identity(thresholds)
    arrays["writer"] = np.int64(writer)
    return metadata.decode_digest(metadata.encode_digest(arrays)), written


def _assert_overview_is_the_merge_of_every_step(fed, series, rows):
    """Every stat's overview (by step, and by epoch when marked) equals `heatmap.merge` of the
    first ``rows`` steps under the digest's own classes and columns."""
    steps = _piece(series, 0, rows)
    classes = fed.classes()
    assert classes.shape == (rows, len(series.variables))
    for stat in series.available_stats:
        for by_epoch in (False, True) if len(fed.epoch_starts) and rows else (False,):
            matrix, column_rows = fed.overview(stat, 2**62, by_epoch=by_epoch)
            if not rows:
                assert matrix.values.shape[1] == 0
                continue
            values = steps.stat(stat)
            expected, worst = heatmap.merge(values, classes, np.asarray(column_rows))
            assert matrix.classes.tolist() == worst.T.tolist()
            # Blocks keep their cells' sums in float32, summed in any order: a mean of c <= n
            # cells is then off by at most (c - 1) * 2**-24 * max|x| (to first order), plus
            # 2**-24 * max|x| for a float64 value stored in float32, within n * 2**-23 * max|x|
            # for a column of n steps. Where either side is not finite they must be equal.
            column_rows = np.asarray(column_rows)
            lengths = np.diff(np.append(column_rows, rows))
            largest = np.maximum.reduceat(np.abs(np.nan_to_num(values, posinf=0, neginf=0)),
                                          column_rows, axis=0)
            bound = (lengths[:, None] * 2**-23 * largest).T
            finite = np.isfinite(matrix.values) & np.isfinite(expected.T)
            assert (np.abs(matrix.values - expected.T)[finite] <= bound[finite]).all()
            assert np.array_equal(matrix.values[~finite], expected.T[~finite], equal_nan=True)

@pytest.mark.parametrize("alongside", [False, True], ids=["one thread", "two threads"])
@pytest.mark.parametrize("seed", range(25))
def test_a_digest_fed_in_pieces_serves_the_merge_of_every_step(seed, alongside, monkeypatch):
    monkeypatch.setattr(digest, "MAX_BLOCKS", 8)  # blocks merge in pairs many times
    series, thresholds = random_series(seed)
    count = len(series.steps)
    random = np.random.default_rng(seed + 1000)
    epoch_starts, epoch_indices = _random_epochs(series, random)
    fed = digest.Digest(_piece(series, 0, 0), thresholds, epoch_starts, epoch_indices)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as summary:
        start = 0
        while start < count:
            stop = min(count, start + int(random.integers(1, 40)))
            fed.feed(_piece(series, start, stop), alongside=summary if alongside else None)
            start = stop
            _assert_overview_is_the_merge_of_every_step(fed, series, start)
    fed.summarise()
    _assert_overview_is_the_merge_of_every_step(fed, series, count)
    assert len(fed._block_starts) - 1 <= digest.MAX_BLOCKS


def _assert_same_answers(restored, fed):
    """``restored`` answers every question the routes ask as ``fed`` does (bit for bit: its
    blocks are the fed digest's, written and read back)."""
    assert restored.rows == fed.rows and restored.block_steps == fed.block_steps
    assert np.array_equal(restored.steps(), fed.steps())
    assert np.array_equal(restored.classes(), fed.classes())
    assert restored.alerts() == fed.alerts()
    for stat in fed.stats:
        for by_epoch in (False, True) if len(fed.epoch_starts) else (False,):
            for row_range in (None, (fed.rows // 3, fed.rows // 2 + 1)):
                for columns in (7, 2**62):
                    mine, mine_rows = restored.overview(stat, columns, row_range, by_epoch)
                    theirs, their_rows = fed.overview(stat, columns, row_range, by_epoch)
                    assert np.array_equal(mine_rows, their_rows)
                    for field in ("steps", "last_steps", "wall_times", "values", "classes"):
                        assert np.array_equal(getattr(mine, field), getattr(theirs, field),
                                              equal_nan=field == "values"), field


@pytest.mark.parametrize("seed", range(25))
def test_a_digest_restored_from_its_records_answers_as_the_digest_fed(seed, monkeypatch):
    """The writer's records (`Digest.record`, through the on-disk encoding) after any number
    of feeds restore a digest that answers as the one fed; blocks merging between records
    (MAX_BLOCKS 8) are written whole again. A record lost, a voided digest, other thresholds
    or other epoch marks are refused or cut where the records stop following."""
    monkeypatch.setattr(digest, "MAX_BLOCKS", 8)
    series, thresholds = random_series(seed)
    count = len(series.steps)
    if not count:
        return
    random = np.random.default_rng(seed + 2000)
    epoch_starts, epoch_indices = _random_epochs(series, random)
    fed = digest.Digest(_piece(series, 0, 0), thresholds, epoch_starts, epoch_indices)
    written, records, rows_after = digest.Written(), [], []
    start = 0
    while start < count:
        stop = min(count, start + int(random.integers(1, 60)))
        fed.feed(_piece(series, start, stop))
        start = stop
        record, written = _record(fed, written, thresholds, seed)
        records.append(record)
        rows_after.append(stop)
        restored = digest.Digest.restored(_piece(series, 0, 0), thresholds, records,
                                          series.wall_times, epoch_starts, epoch_indices)
        _assert_same_answers(restored, fed)
    # As the plugin reads them: blocks only from the last record that wrote them all on.
    last_whole = max(i for i, r in enumerate(records) if int(r["first_block"]) == 0)
    sparse = [r if i >= last_whole else {k: v for k, v in r.items()
                                          if k not in digest.BLOCK_ARRAYS}
              for i, r in enumerate(records)]
    _assert_same_answers(digest.Digest.restored(_piece(series, 0, 0), thresholds, sparse,
                                                series.wall_times, epoch_starts, epoch_indices),
                         fed)
    if len(records) > 2:  # a lost record: the records before it still restore
        cut = int(random.integers(1, len(records) - 1))
        kept = digest.Digest.restored(_piece(series, 0, 0), thresholds,
                                      records[:cut] + records[cut + 1:], series.wall_times,
                                      epoch_starts, epoch_indices)
        assert kept.rows == rows_after[cut - 1]
    with pytest.raises(ValueError, match="voided"):
        digest.Digest.restored(_piece(series, 0, 0), thresholds,
                               records + [{"void": np.int64(1)}], series.wall_times)
    other = dataclasses.replace(thresholds, sustain_steps=thresholds.sustain_steps + 1)
    with pytest.raises(ValueError, match="no digest record of this analysis"):
        digest.Digest.restored(_piece(series, 0, 0), other, records, series.wall_times,
                               epoch_starts, epoch_indices)
    if epoch_starts is not None:
        with pytest.raises(ValueError, match="other epoch starts"):
            digest.Digest.restored(_piece(series, 0, 0), thresholds, records, series.wall_times)


@pytest.mark.parametrize("seed", range(40))
def test_a_digest_continued_from_its_records_goes_on_as_the_digest_fed_whole(seed, monkeypatch):
    """After any number of feeds, the writer's records (through the on-disk encoding, blocks
    only from the last record that wrote them all on) and the few rows read back make a digest
    (`Digest.continued`) that takes the rest of the run and then answers every question as the
    digest fed the whole run does, bit for bit: a restarted job's steps cost only those steps.
    Records written without the state, or rows read back that are not the records' rows, are
    refused."""
    monkeypatch.setattr(digest, "MAX_BLOCKS", 8)
    series, thresholds = random_series(seed)
    count = len(series.steps)
    if count < 2:
        return
    random = np.random.default_rng(seed + 3000)
    epoch_starts, epoch_indices = _random_epochs(series, random)
    cuts = [0]
    while cuts[-1] < count:
        cuts.append(min(count, cuts[-1] + int(random.integers(1, 60))))
    stopped = int(random.integers(1, len(cuts) - 1)) if len(cuts) > 2 else 1
    stop_at = cuts[stopped]  # the writer's last record covers this many rows
    # The digest never stopped, fed the same pieces (blocks merge as they come).
    whole = digest.Digest(_piece(series, 0, 0), thresholds, epoch_starts, epoch_indices, 2)
    writer = digest.Digest(_piece(series, 0, 0), thresholds, epoch_starts, epoch_indices, 2)
    written, records = digest.Written(), []
    for start, stop in zip(cuts[:stopped], cuts[1:stopped + 1]):
        writer.feed(_piece(series, start, stop))
        record, written = _record(writer, written, thresholds, seed)
        records.append(record)
    last_whole = max(i for i, r in enumerate(records) if int(r["first_block"]) == 0)
    records = [r if i >= last_whole else {k: v for k, v in r.items()
                                           if k not in digest.BLOCK_ARRAYS}
               for i, r in enumerate(records)]
    read_back = []

    def rows_of(first, last):
        read_back.append((first, last))
        return _piece(series, first, last)

    continued = digest.Digest.continued(_piece(series, 0, 0), thresholds, records,
                                        series.wall_times, rows_of, epoch_starts, epoch_indices)
    (first, last), = read_back
    # A few rows: the rules' windows (the dead rule's counts steps with every stat, at most
    # `stats_every` rows apart) and the blocks not yet summarised.
    assert last == stop_at and stop_at - first <= 2 * thresholds.spike_window + max(
        context_rows(thresholds, series.stats_every) + 1, writer.block_steps
    ) + 2 * digest.MAX_BLOCKS
    for start, stop in zip(cuts[:-1], cuts[1:]):
        whole.feed(_piece(series, start, stop))
        if start >= stop_at:
            continued.feed(_piece(series, start, stop))
    _assert_same_answers(continued, whole)

    with pytest.raises(ValueError, match="no state"):
        digest.Digest.continued(_piece(series, 0, 0), thresholds,
                                [{k: v for k, v in r.items() if k != "stream_rows"}
                                 for r in records], series.wall_times, rows_of, epoch_starts,
                                epoch_indices)
    with pytest.raises(ValueError, match="not the digest records' rows"):
        digest.Digest.continued(
            _piece(series, 0, 0), thresholds, records, series.wall_times,
            lambda a, b: dataclasses.replace(_piece(series, a, b), steps=series.steps[a:b] + 1),
            epoch_starts, epoch_indices)
