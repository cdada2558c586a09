"""Format: the on-disk contract and everything that reads or writes it, TF-free.

`metadata` (plugin name, versions, metadata content), `columns` (THE table of statistics, all a
statistic needs but its formula, and the histogram bins), `layout` (rows: variables, layers,
shapes, tags per layout), `statistics/` (the statistics and histograms behind the columns, once
for every array library: `array_ops` the adapter and the passes over the entries, `formulas`,
`shards`, `histograms`), `event_files` (records), `writer` (`GradientWriter`) with `digest_feed`
(the digest it keeps as it writes), `series` (`GradientSeries` from logged points), `reader`
(`read_logdir`) and `inventory` (what a logdir without gradients holds, in the words the CLI and
the tab use).
"""
