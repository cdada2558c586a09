"""The gradient statistics and histograms, written once for every array library.

Each library is an `ArrayOps` adapter (`array_ops`: numpy's here, the others in `capture/`);
over it, the statistics' formulas (`formulas`: the per-variable reductions of one step, fast
path and masked pass, and the stats made of them), the shards of one variable combined into
it (`shards`), Adam's preconditioned-gradient RMS (`adam`), and the log10|g| histograms counted
from the bit patterns (`histograms`). What a stat needs besides its formula (its passes, how a
layer combines it) is its `columns` row.
Writers and adapters call the names below as ``statistics.<name>``.
"""

from tensorboard_gradients.format.statistics.adam import adam_rms
from tensorboard_gradients.format.statistics.array_ops import (
    GROUP_MAX_ENTRIES, GROUPED_ARRAY_MAX_ENTRIES, MATRIX_REDUCTIONS, ArrayOps, NumpyOps,
    entry_batches, numpy_float, size_groups)
from tensorboard_gradients.format.statistics.formulas import (
    REDUCTIONS, checked_fast_rows, combine_moments, fast_reductions, masked_reduction_matrix,
    norms_only_columns, norms_only_matrix, norms_only_statistics, pass_matrix, passes_for,
    reduction_matrix, scaled_sums, stack_reductions, statistics_from_reductions, statistics_matrix,
    surely_trusted_passes, trusted_norm_floats, trusted_norms, least_trusted_norms)
from tensorboard_gradients.format.statistics.histograms import (
    histogram_bit_tables, histogram_matrix, histogram_rows)
from tensorboard_gradients.format.statistics.shards import combine_shards

__all__ = [
    "ArrayOps", "NumpyOps", "size_groups", "entry_batches", "numpy_float",
    "GROUPED_ARRAY_MAX_ENTRIES", "GROUP_MAX_ENTRIES", "MATRIX_REDUCTIONS", "REDUCTIONS",
    "stack_reductions", "passes_for", "pass_matrix", "fast_reductions", "checked_fast_rows",
    "surely_trusted_passes", "scaled_sums", "masked_reduction_matrix", "norms_only_matrix",
    "trusted_norms", "trusted_norm_floats", "least_trusted_norms", "norms_only_statistics",
    "norms_only_columns", "reduction_matrix", "statistics_from_reductions", "statistics_matrix",
    "combine_moments", "combine_shards", "histogram_bit_tables", "histogram_rows",
    "histogram_matrix", "adam_rms",
]
