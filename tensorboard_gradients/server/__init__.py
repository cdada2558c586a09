"""Server: the TensorBoard plugin that serves the Gradients tab.

A request goes down these layers, each a module:

* `plugin` - the entry point TensorBoard loads (`GradientsLoader`, `GradientsPlugin`) and the
  thin route handlers; its docstring documents every route.
* `queries` - a request's query string, validated (`Query`; `BadRequest` is a 400).
* `answers` - what each route answers as a plain, JSON-ready dict, callable without HTTP
  (`runs_overview`, `heatmap_answer`, `alerts_answer`, `series_answer`, `histogram_answer`,
  `thresholds_answer`).
* `responses` - the HTTP side: JSON and kept gzipped JSON responses, CSV downloads, errors
  mapped to 400/404 and the last-resort JSON 500.
* `encoding` - numbers as JSON (NaN/Inf as strings), base64-packed matrices, gzip.
* `vocabulary` - what the tab calls and how it draws stats, classes, severities and thresholds
  (served with the ``thresholds`` answer).
* `heatmap` - the layer x step matrix with columns merged without hiding the worst (numpy).
* `export` - the whole matrix as CSV.
* `data_access` - series read through TensorBoard's data provider (both loaders), each tag's
  failure kept to that tag; it relies on `cache` (what is kept between requests),
  `decode_guard` (tensors checked against their metadata before TensorBoard decodes them),
  `integrity` (a local logdir's records failing their checksum, and where each logged point
  lies) and `damage` (what was left out, and the sentences that say so).
* `long_runs` - tags too long for TensorBoard to hold (local logdirs): read from their event
  files a few thousand steps at a time; `digest` keeps what their routes need (classes,
  alerts, per-block heatmap groups), fed as the run grows, in the background.

Where to change what:

* a route (its parameters or its answer): `plugin` (the handler) and `answers`;
* the colour of a class or severity, a label: `vocabulary`;
* a new statistic: `format/columns.py` (and its formula in `format/statistics.py`); the tab
  learns it from `vocabulary`, no server or frontend edit;
* a diagnosis rule or threshold: the `analysis` package; the tab learns thresholds from
  `vocabulary`.
"""
