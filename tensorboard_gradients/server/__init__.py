"""Server: the TensorBoard plugin that serves the Gradients tab.

Two layers, with a wall between them (`tests/test_architecture.py` holds it):

The HTTP layer, a request going down these modules:

* `plugin` - the entry point TensorBoard loads (`GradientsLoader`, `GradientsPlugin`) and the
  thin route handlers; each route's contract is in ``docs/http-api.md``, nowhere else.
* `queries` - a request's query string, validated (`queries.BadRequest` is a 400).
* `answers` - what each route answers as a plain, JSON-ready dict, callable without HTTP
  (`runs_overview`, `heatmap_answer`, `alerts_answer`, `series_answer`, `histogram_answer`,
  `inventory_answer`, `thresholds_answer`), built from a tag's `store.RunSource` the same way
  whatever the run's length or where it is read from.
* `responses` - the HTTP side: JSON and kept gzipped JSON responses, CSV downloads, deliberate
  errors mapped to 400/404 and anything else to a logged JSON 500.
* `encoding` - numbers as JSON (NaN/Inf as strings), base64-packed matrices, gzip.
* `vocabulary` - what the tab calls and how it draws stats, classes, severities and thresholds
  (served with the ``thresholds`` answer).
* `export` - the whole matrix as CSV.

The storage, `store`: the HTTP modules import its package names (`store.Store`, the registry;
`store.RunSource`, one tag's data; its errors) and nothing inside it. It reads a local logdir's
event files itself and anything else through TensorBoard's data provider; every thread and lock
of the plugin lives there.

Where to change what:

* a route (its parameters or its answer): `plugin` (the handler), `answers` and
  ``docs/http-api.md``;
* the colour of a class or severity, a label: `vocabulary`;
* a new statistic: `format/columns.py` (and its formula in `format/statistics/`); the tab
  learns it from `vocabulary`, no server or frontend edit;
* a diagnosis rule or threshold: the `analysis` package; the tab learns thresholds from
  `vocabulary`;
* how a tag is read: `store` (a new kind of source implements `store.RunSource` and is picked
  in `store.registry`).
"""
