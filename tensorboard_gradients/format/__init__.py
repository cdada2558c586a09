"""Format: the on-disk contract and everything that reads or writes it, TF-free.

`metadata` (plugin name, versions, metadata content), `columns` (THE table of statistics and the
histogram bins), `layout` (rows: variables, layers, shapes, tags per layout), `statistics` (the
formulas behind the columns, once for every array library), `event_files` (records), `writer`
(`GradientWriter`), `series` (`GradientSeries` from logged points), `reader` (`read_logdir`)
and `inventory` (what a logdir without gradients holds, in the words the CLI and the tab use).
"""
