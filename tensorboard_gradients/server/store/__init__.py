"""The plugin's storage: every tag's data, behind one interface (`RunSource`).

The HTTP modules (`server.answers`, `server.plugin`, ...) import this package's names and
nothing inside it (`tests/test_architecture.py` holds the wall):

* `Store` - the registry: lists this plugin's tags and gives the `RunSource` of a stats tag,
  picking its reader per tag and keeping what was read between requests;
* `RunSource` - one stats tag: its variables and stats (``like``), logged steps, rows of a step
  range, the digest under a thresholds with what is still unread, histograms near a step,
  damage;
* `UnknownError` (404) and `UnreadableTagError` (400), `HistogramAt`;
* `prescan` (a local logdir's files located from TensorBoard's start) and `answering` (held while
  a request is answered: background reading pauses meanwhile).

Inside, one concern per module: `source` (the interface), `registry`, `local` (a local
logdir's tags, read from their event files) over `local_tag` (one tag's steps located, read back
and digested as the run grows, in the background for long runs), `event_scan` (every record of a
run's files located and verified; damage per run) over `file_scan` (one file's records,
from its bytes or a bucket segment's index), `damage`
(the sentences that say what was left out), `provider` (TensorBoard's data provider, for what
only it can read) with `decode_guard`, `cache` (what is kept, by bytes) and `traffic`
(background work pausing while requests are answered). Every thread and lock of the plugin
lives here.
"""

from tensorboard_gradients.server.store.event_scan import prescan
from tensorboard_gradients.server.store.registry import Store
from tensorboard_gradients.server.store.source import (
    HistogramAt, RunSource, UnknownError, UnreadableTagError,
)
from tensorboard_gradients.server.store.traffic import REQUESTS

answering = REQUESTS.answering

__all__ = ["HistogramAt", "RunSource", "Store", "UnknownError", "UnreadableTagError", "answering",
           "prescan"]
