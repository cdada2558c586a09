"""Statistics of sharded variables: each shard's partial results combined by each statistic's own
rule (`statistics.combine_shards`) equal the statistics of the whole variable."""

import numpy as np
import pytest

from conftest import stat_tolerances
from tensorboard_gradients.format import columns, statistics

OPS = statistics.NumpyOps


def _variables(rng):
    biased = 1e4 + rng.normal(size=300).astype(np.float32)  # |mean| >> std: naive sums cancel
    with_nonfinite = rng.normal(size=(40, 5)).astype(np.float32)
    with_nonfinite[3, 2], with_nonfinite[7, 1] = np.nan, np.inf
    sparse_like = np.zeros(64, np.float32)
    sparse_like[::9] = rng.normal(size=8)
    huge = np.full(50, 3e38, np.float32) * rng.choice([-1, 1], 50).astype(np.float32)
    return [rng.normal(size=(33, 7)).astype(np.float32), biased, with_nonfinite, sparse_like,
            huge, np.zeros(10, np.float32)]


def _shard_rows(variables, shards, rng):
    """[shards, variables, REDUCTIONS]: each variable cut into uneven (maybe empty) pieces."""
    parts = []
    for variable in variables:
        flat = variable.reshape(-1)
        cuts = np.sort(rng.integers(0, flat.size + 1, size=shards - 1))
        parts.append(np.split(flat, cuts))
    rows = []
    for shard in range(shards):
        pieces = [(p[shard], p[shard].size) for p in parts]
        with np.errstate(over="ignore", invalid="ignore"):  # as the writer: the masked pass
            reductions, _ = statistics.reduction_matrix(OPS, pieces, np.float32)
        rows.append(reductions)
    return np.stack(rows), [[p[s] for p in parts] for s in range(shards)]


@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_combined_shards_equal_the_whole_variables(shards):
    rng = np.random.default_rng(shards)
    variables = _variables(rng)
    parts, pieces = _shard_rows(variables, shards, rng)
    combined = statistics.combine_shards(parts, np.ones(parts.shape[:2], bool))
    sizes = np.array([v.size for v in variables], np.float64)
    weight_norms = np.array([np.sqrt(sum(float(np.sum(p.astype(np.float64) ** 2))
                                         for p in (s[i] for s in pieces)))
                             for i in range(len(variables))])
    got = statistics.statistics_from_reductions(OPS, combined, sizes, weight_norms)
    with np.errstate(over="ignore", invalid="ignore"):
        whole = statistics.statistics_matrix(
            OPS, [(v.reshape(-1).astype(np.float64), v.size) for v in variables],
            [v.astype(np.float64) for v in variables], np.float64)
    stats = columns.stats_for(with_weights=True, with_updates=False)
    for row in range(len(variables)):
        expected = dict(zip(stats, whole[row]))
        # float32 shards against a float64 whole: the float32 rounding bounds of conftest apply
        # (the combination itself is float64, a few roundings per shard).
        tolerance = stat_tolerances(expected, np.float32)
        for column, name in enumerate(stats):
            if not np.isfinite(expected[name]):
                assert got[row, column] == expected[name] or (
                    np.isnan(expected[name]) and np.isnan(got[row, column])), (row, name)
            else:
                assert abs(got[row, column] - expected[name]) <= tolerance[name], (row, name)


def test_replicas_count_once_and_a_missing_shard_makes_the_variable_missing():
    rng = np.random.default_rng(0)
    variables = _variables(rng)
    parts, _ = _shard_rows(variables, 2, rng)
    replicated = np.concatenate([parts, parts])  # two data-parallel copies of both shards
    counted = np.array([[True] * len(variables)] * 2 + [[False] * len(variables)] * 2)
    assert np.array_equal(statistics.combine_shards(replicated, counted),
                          statistics.combine_shards(parts, counted[:2]), equal_nan=True)
    parts[1, 0] = np.nan  # shard 1 of variable 0 had no gradient
    combined = statistics.combine_shards(parts, np.ones(parts.shape[:2], bool))
    assert np.isnan(combined[0]).all() and not np.isnan(combined[1]).any()
