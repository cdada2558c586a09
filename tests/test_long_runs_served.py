"""Long runs (`server.store.local_tag`): read from their event files and answered from a digest, the
routes say what they say of the same run read whole through TensorBoard, and a growing run
costs only its new steps.

Runs here are small; the tests make them "long" by lowering `LONG_RUN_STEPS`, and compare each
answer with the one the short-run path (every step through TensorBoard's data provider) gives
for the same logdir. The real sizes are in `test_long_run.py` and `benchmarks/long_run.py`.

Runs are written without the writer's digest (``digest=False``, as by format 1.1 writers), so
the plugin digests them itself, unless a test says otherwise (``written_logdir``): then the
plugin answers from the writer's digest records (`format.digest_feed`).
"""

import contextlib
import dataclasses
import json
import threading
import time
import urllib.parse

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import digest
from tensorboard_gradients.format import digest_feed
from tensorboard_gradients.server import answers
from tensorboard_gradients.server.store import local_tag, traffic

BASE = "/data/plugin/gradients/"
VARIABLES = 12
STEPS = 1300
EPOCH_STEPS = 250
SPIKES = {(300, 3), (777, 8), (1201, 0)}  # (step, variable)
NAN_CELL = (650, 5)
LATE_NAN_STEP = STEPS + 100  # the same cell again, in steps a growing run appends
# From this step the loss rises by these, the gradient 4x up: to x2.5 at the fifth rise (warned),
# then x6 twice (a spike, told at its second step); from x1.2 with the gradient up for 4 steps
# (the sustained precursor, told at the fourth).
LOSS_CLIMB = (1100, (0.1, 0.2, 0.3, 0.7, 1.5, 5.0, 5.0))


def _gradients(rng, step, scale):
    grads = {f"layer_{i // 2}/{'kernel' if i % 2 == 0 else 'bias'}":
             rng.normal(size=(4, 3) if i % 2 == 0 else (3,)) * scale[i] for i in range(VARIABLES)}
    names = list(grads)
    for spike_step, row in SPIKES:
        if step == spike_step:
            grads[names[row]] = grads[names[row]] * 1e4
    if step in (NAN_CELL[0], LATE_NAN_STEP):
        grads[names[NAN_CELL[1]]][0] = np.nan
    if 900 <= step < 940:  # layer_5 vanishing for 40 steps
        for row in (10, 11):
            grads[names[row]] = grads[names[row]] * 1e-12
    if LOSS_CLIMB[0] <= step < LOSS_CLIMB[0] + len(LOSS_CLIMB[1]):  # the gradient climbs too
        grads = {name: grad * 4 for name, grad in grads.items()}
    return grads


def _loss(step):
    """The loss: flat, but for a climb (a loss-spike precursor, then the spike)."""
    first, climb = LOSS_CLIMB
    return 1.0 + 0.01 * np.sin(step) + (climb[step - first] if 0 <= step - first < len(climb)
                                        else 0.0)


def _write(directory, first, last, seed, digest=False, writer=None, late_loss=False):
    rng = np.random.default_rng(seed)
    scale = 10 ** np.linspace(-3, -1, VARIABLES)
    weights = {f"layer_{i // 2}/{'kernel' if i % 2 == 0 else 'bias'}":
               np.ones((4, 3) if i % 2 == 0 else (3,)) for i in range(VARIABLES)}
    with (writer or tg.GradientWriter(str(directory), digest=digest)) as writer:
        for step in range(first, last):
            if step % EPOCH_STEPS == 0:
                writer.write_epoch(step, step // EPOCH_STEPS)
            writer.write(step, _gradients(rng, step, scale), weights=weights,
                         histograms=step % 50 == 0, loss=None if late_loss else _loss(step))
            if late_loss:  # as a trainer reports it, once the step is done
                writer.write_loss(step, _loss(step))


@pytest.fixture()
def logdir(tmp_path):
    _write(tmp_path / "run", 0, STEPS, seed=1)
    return tmp_path


@pytest.fixture()
def written_logdir(tmp_path):
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=True)
    return tmp_path


def _get(client, route, long, monkeypatch, **params):
    """The route's JSON answer with the run served as long (``long``) or as short."""
    monkeypatch.setattr(local_tag, "LONG_RUN_STEPS", 400 if long else 10**9)
    if route != "runs":
        params = dict(run="run", tag="gradients", **params)
    response = client.get(BASE + route + "?" + urllib.parse.urlencode(params))
    assert response.status_code == 200, response.get_data()[:500]
    body = response.get_data()
    return json.loads(body) if response.mimetype == "application/json" else body.decode()


@pytest.mark.parametrize("written", [False, True], ids=["plugin_digest", "writer_digest"])
@pytest.mark.parametrize("max_blocks", [digest.MAX_BLOCKS, 64])
def test_every_route_answers_a_long_run_as_the_run_read_whole(tmp_path, plugin_client,
                                                              monkeypatch, max_blocks, written):
    """With one block per step, and with blocks merged in pairs five times over (64 blocks
    at most: blocks of 32 steps, cut at epoch starts); digested by the plugin, or by the
    writer (then the plugin judges no step)."""
    monkeypatch.setattr(digest, "MAX_BLOCKS", max_blocks)
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=written)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch, written) as fed:
        _assert_routes_answer_as_the_run_read_whole(client, monkeypatch)
        assert (fed == []) == written  # the writer's digest answers: no step judged again


def test_a_writers_digest_of_many_records_is_read_back_whole(tmp_path, plugin_client,
                                                             monkeypatch):
    """A record every 50 steps, blocks merged after 1,024 steps: the blocks are taken from the
    last record that wrote them all on (`LocalTag._records`), and the routes answer as the run
    read whole."""
    monkeypatch.setattr(digest_feed, "EVERY_STEPS", 50)
    monkeypatch.setattr(digest, "MAX_BLOCKS", 64)
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=True)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch) as fed:
        _assert_routes_answer_as_the_run_read_whole(client, monkeypatch)
        assert fed == []  # the writer's digest answered


def test_a_loss_written_after_its_step_is_judged_in_the_writers_digest(tmp_path, plugin_client,
                                                                      monkeypatch):
    """`GradientWriter.write_loss` after the step's statistics (Lightning, the Trainer): the
    writer's digest takes it with its step, and answers as the run read whole."""
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=True, late_loss=True)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch) as fed:
        _assert_routes_answer_as_the_run_read_whole(client, monkeypatch)
        assert fed == []  # the writer's digest answered


@contextlib.contextmanager
def _plugin_busy(client, monkeypatch, busy=True):
    """Yields the rows the plugin judges itself (`Digest.feed`); while ``busy``, as if its
    background digest were still reading the run (it cannot answer from its own digest)."""
    fed = _fed_rows(monkeypatch)
    _get(client, "runs", True, monkeypatch)  # the run becomes a long run
    held = [run for run in _long_runs_of(client).values() if busy]
    for long_run in held:
        assert long_run._feeding.acquire(blocking=False)
    try:
        yield fed
    finally:
        for long_run in held:
            long_run._feeding.release()
        for long_run in _long_runs_of(client).values():  # its own digest, read meanwhile
            if long_run._reader is not None:
                long_run._reader.join(timeout=60)


def _assert_routes_answer_as_the_run_read_whole(client, monkeypatch, steps=STEPS):

    def both(route, **params):
        return (_get(client, route, True, monkeypatch, **params),
                _get(client, route, False, monkeypatch, **params))

    long, short = both("runs")
    assert long == short and long["run"]["gradients"]["steps"] == steps
    long, short = both("alerts")
    assert long == short
    # The loss logged beside the gradients: its precursors and its spike, each raised where the
    # run read whole raises it.
    assert {(a["rule"], a["first_step"], a["raised_step"]) for a in long["alerts"]
            if a["kind"] == "loss_spike"} == {("precursor", 1104, 1104), ("spike", 1105, 1106),
                                              ("sustained", 1101, 1104)}
    assert {(a["first_step"], a["variable"]) for a in long["alerts"] if a["rule"] == "spike"} >= {
        (step, short_name) for step, short_name in
        ((s, f"layer_{r // 2}/{'kernel' if r % 2 == 0 else 'bias'}") for s, r in SPIKES)}
    # A zoom at full resolution: the same matrix as the short run's zoom.
    long, short = both("heatmap", stat="l2_norm", first_step=610, last_step=700)
    assert long == short
    long, short = both("heatmap", stat="std", first_step=610, last_step=700, rows="layers")
    assert long == short and long["variables"] == [f"layer_{i}" for i in range(VARIABLES // 2)]
    # The overview by layer: each column's class is the worst of its variables' columns.
    by_layer = _get(client, "heatmap", True, monkeypatch, stat="l2_norm", rows="layers")
    by_variable = _get(client, "heatmap", True, monkeypatch, stat="l2_norm")
    order = {name: i for i, name in enumerate(analysis.CLASSES)}
    worst = [[max(pair, key=order.get) for pair in zip(*by_variable["classes"][2 * i:2 * i + 2])]
             for i in range(VARIABLES // 2)]
    assert by_layer["classes"] == worst and by_layer["steps"] == by_variable["steps"]
    long, short = both("series", variable="layer_2", rows="layers")
    assert long["classes"] == [max(pair, key=order.get) for pair in zip(*(
        _get(client, "series", True, monkeypatch, variable_index=row)["classes"]
        for row in (4, 5)))]
    block = int(np.searchsorted(long["steps"], NAN_CELL[0], "right")) - 1  # holding the NaN
    assert long["stats"]["nan_count"][block] == 1
    # A run of at most `FULL_RESOLUTION_STEPS` steps answers every step, long or not; a longer
    # one per block, whoever read it.
    if steps <= answers.FULL_RESOLUTION_STEPS:
        assert short["stats"]["nan_count"][NAN_CELL[0]] == 1 and long == short
    else:
        assert long["downsampled"] and long == short
    # A histogram, and the whole run as CSV (read back a few thousand steps at a time).
    long, short = both("histogram", variable_index=3, step=612)
    assert long == short and long["step"] == 600
    long_csv, short_csv = both("export", format="csv")
    assert long_csv == short_csv and long_csv.count("\n") == steps * VARIABLES + 1
    # The epoch axis: blocks never span an epoch start, so epochs merge exactly. Blocks keep
    # their sums in float32: a sum of n float32 terms is off by at most n * 2**-24 of the sum
    # of their magnitudes (norms are positive), n <= 250 steps per epoch here.
    long, short = both("heatmap", stat="l2_norm", axis="epoch")
    assert long["steps"] == short["steps"] and long["classes"] == short["classes"]
    assert long["epoch_index"] == short["epoch_index"]
    np.testing.assert_allclose(np.asarray(long["values"], float),
                               np.asarray(short["values"], float), rtol=EPOCH_STEPS * 2**-24)


@pytest.mark.parametrize("written", [False, True], ids=["plugin_digest", "writer_digest"])
@pytest.mark.parametrize("max_blocks", [digest.MAX_BLOCKS, 40])
def test_the_overview_of_a_long_run_hides_no_step(tmp_path, plugin_client, monkeypatch,
                                                  max_blocks, written):
    """Overview columns are whole blocks of the digest; each column's class is the worst of
    its steps (as judged on the whole run)."""
    monkeypatch.setattr(digest, "MAX_BLOCKS", max_blocks)
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=written)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch, written):
        steps_of_columns = _assert_hides_no_step(client, monkeypatch, max_steps=8)
    assert len(steps_of_columns["steps"]) == 8
    flagged = {(int(np.searchsorted(steps_of_columns["steps"], step, "right") - 1), row)
               for step, row in SPIKES}
    for column, row in flagged:
        assert steps_of_columns["classes"][row][column] == "spike"


def _assert_hides_no_step(client, monkeypatch, **params):
    """The long run's overview (``params``), each column's classes the worst of its steps'
    in the run read whole (steps are 0, 1, ...)."""
    overview = _get(client, "heatmap", True, monkeypatch, stat="l2_norm", **params)
    # Every step's classes: zooms of at most `FULL_RESOLUTION_STEPS` steps are read whole.
    zooms, first = [], 0
    while not zooms or zooms[-1]["steps"]:
        zooms.append(_get(client, "heatmap", False, monkeypatch, stat="l2_norm",
                          max_steps=10_000, first_step=first,
                          last_step=first + answers.FULL_RESOLUTION_STEPS - 1))
        assert not zooms[-1]["downsampled"]
        first += answers.FULL_RESOLUTION_STEPS
    per_step = {"steps": sum((zoom["steps"] for zoom in zooms), [])}
    classes = np.concatenate([np.array(zoom["classes"]).reshape(len(overview["classes"]), -1)
                              for zoom in zooms], axis=1)
    order = {name: i for i, name in enumerate(analysis.CLASSES)}
    for column, (first, last) in enumerate(zip(overview["steps"], overview["last_steps"])):
        worst = [max(row[first:last + 1], key=order.get) for row in classes]
        assert [row[column] for row in overview["classes"]] == worst
    assert overview["last_steps"][-1] == per_step["steps"][-1]
    return overview


def test_a_growing_long_run_reads_only_its_new_steps(logdir, plugin_client, monkeypatch):
    client = plugin_client(str(logdir))
    read = []
    real_feed = digest.Digest.feed

    def counted(self, rows, **options):
        read.append(len(rows.steps))
        return real_feed(self, rows, **options)

    monkeypatch.setattr(digest.Digest, "feed", counted)
    first = _get(client, "alerts", True, monkeypatch)
    assert sum(read) == STEPS
    _write(logdir / "run", STEPS, STEPS + 150, seed=2)
    client.reload()
    read.clear()
    grown = _get(client, "alerts", True, monkeypatch)
    assert sum(read) == 150  # the new steps only
    assert grown == _get(client, "alerts", False, monkeypatch)
    assert grown != first  # the NaN of a new step


def test_a_digest_that_failed_half_fed_is_read_again_by_the_next_request(
        logdir, plugin_client, monkeypatch):
    """A failure while summarising (say, out of memory) fails that request only: the half-fed
    digest could take no later step, so it is dropped and the next request reads the run."""
    client = plugin_client(str(logdir))
    real_summarise = digest.Digest._summarise
    failures = []

    def fails_once(self, cuts):
        if not failures:
            failures.append(cuts)
            raise MemoryError("no room for the blocks")
        return real_summarise(self, cuts)

    monkeypatch.setattr(digest.Digest, "_summarise", fails_once)
    monkeypatch.setattr(local_tag, "LONG_RUN_STEPS", 400)
    response = client.get(BASE + "alerts?run=run&tag=gradients")
    assert response.status_code == 500 and failures
    assert _get(client, "alerts", True, monkeypatch) == _get(client, "alerts", False, monkeypatch)


def test_a_rewritten_step_digests_the_run_again(logdir, plugin_client, monkeypatch):
    """A restarted job that logs steps again (here 1,200 onwards) changes old steps: the digest
    starts over and answers as the run read whole."""
    client = plugin_client(str(logdir))
    _get(client, "alerts", True, monkeypatch)
    _write(logdir / "run", 1200, STEPS + 50, seed=3)
    client.reload()
    assert _get(client, "alerts", True, monkeypatch) == _get(client, "alerts", False, monkeypatch)
    assert _get(client, "runs", True, monkeypatch)["run"]["gradients"]["steps"] == STEPS + 50


def test_a_zoom_of_2000_steps_is_read_at_full_resolution():
    assert answers.FULL_RESOLUTION_STEPS >= 2000


def test_long_runs_are_digested_before_the_first_request(logdir, plugin_client, monkeypatch):
    """A real TensorBoard's plugin digests long runs in the background as TensorBoard reads the
    logdir (at its reload interval), so the first heatmap and alerts read no step."""
    import argparse

    from tensorboard import context as tb_context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from tensorboard_gradients.server import plugin

    monkeypatch.setattr(local_tag, "LONG_RUN_STEPS", 400)
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradients": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    context = base_plugin.TBContext(
        logdir=str(logdir), flags=argparse.Namespace(reload_interval=0),
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)))
    served = plugin.GradientsLoader().load(context)
    workers = [t for t in threading.enumerate() if t.name == "tensorboard-gradients digests"]
    assert workers, "no background digest with TensorBoard's flags"
    workers[0].join(timeout=120)
    read = []
    monkeypatch.setattr(digest.Digest, "feed", lambda self, rows: read.append(rows))
    loaded = served._store.source(tb_context.RequestContext(), "", "run", "gradients")
    alerts = loaded._tag().digest(tg.Thresholds()).alerts()
    assert read == [] and any(a.kind == "nonfinite" for a in alerts)


def test_while_the_background_reads_a_long_run_answers_say_how_far_it_got(
        logdir, plugin_client, monkeypatch):
    """A request does not wait for the background digest: it answers with the steps read so
    far and says so in ``sampled``; once the digest has read everything, the full answer
    (not the kept partial one) is served."""
    client = plugin_client(str(logdir))
    _get(client, "runs", True, monkeypatch)  # the run becomes a long run
    long_run = next(iter(_long_runs_of(client).values()))
    assert long_run._feeding.acquire(blocking=False)  # as the background digest does
    try:
        partial = _get(client, "alerts", True, monkeypatch)
        heatmap = _get(client, "heatmap", True, monkeypatch, stat="l2_norm")
        details = _get(client, "series", True, monkeypatch, variable_index=0)
    finally:
        long_run._feeding.release()
    assert partial["alerts"] == [] and "0 of its 1,300 logged steps" in partial["sampled"]
    assert heatmap["sampled"] == partial["sampled"] and heatmap["steps"] == []
    assert details["sampled"] == partial["sampled"] and details["steps"] == []
    assert partial["steps_to_read"] == heatmap["steps_to_read"] == details["steps_to_read"] == 1300
    whole = _get(client, "series", True, monkeypatch, variable_index=0)
    assert whole["sampled"] is None and whole["steps_to_read"] == 0
    complete = _get(client, "alerts", True, monkeypatch)
    assert complete["sampled"] is None and complete == _get(client, "alerts", False, monkeypatch)


def _long_runs_of(client):
    """The `LocalTag`s of the plugin a `plugin_client` serves."""
    (plugin,) = [p for p in client.application._plugins if p.plugin_name == "gradients"]
    local = plugin._store._local  # as its background pass takes them up
    return {(look.run, tag): local.long_local_tag(look, tag, parsed, epochs)
            for look, tag, parsed, epochs in local.long_tags()}


def test_a_run_of_more_epochs_than_blocks_keeps_one_block_per_epoch():
    """Blocks never merge across an epoch start: with an epoch every 2 steps and room for 16
    blocks, merging stops at one block per epoch instead of looping, and the epoch axis
    still merges each epoch exactly."""
    from tensorboard_gradients.format.layout import Layout
    from tensorboard_gradients.format.series import GradientSeries
    from tensorboard_gradients.analysis import heatmap

    rng = np.random.default_rng(4)
    layout = Layout.create(["a/kernel", "b/kernel"], [(3, 3)] * 2, with_weights=False)
    values = np.zeros((200, 2, len(layout.stats)), np.float32)
    values[..., layout.stats.index("l2_norm")] = 10 ** rng.normal(-2, 0.1, (200, 2))
    values[..., layout.stats.index("size")] = 9
    values[77, 1, layout.stats.index("l2_norm")] = 1e4  # exploding
    steps = np.arange(200)
    series = GradientSeries("run", "gradients", "gradients", layout.variables, layout.layers,
                            layout.shapes, layout.stats, steps, steps.astype(float), values,
                            epoch_starts=steps[::2], epoch_indices=np.arange(100))
    result = {}

    def digest_it():
        kept = digest.MAX_BLOCKS
        digest.MAX_BLOCKS = 16
        try:
            made = digest.Digest(dataclasses.replace(series, steps=steps[:0]),
                                 tg.Thresholds(), series.epoch_starts, series.epoch_indices)
            for start in range(0, 200, 30):
                made.feed(dataclasses.replace(series, steps=steps[start:start + 30],
                                              wall_times=series.wall_times[start:start + 30],
                                              values=values[start:start + 30]))
            result["epochs"] = made.overview("l2_norm", 1000, by_epoch=True)[0]
        finally:
            digest.MAX_BLOCKS = kept

    worker = threading.Thread(target=digest_it, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "merging blocks did not stop"
    expected = heatmap.build(series, "l2_norm", tg.classify(series), 1000, by_epoch=True)
    assert result["epochs"].steps.tolist() == expected.steps.tolist()
    np.testing.assert_array_equal(result["epochs"].classes, expected.classes)
    assert result["epochs"].classes[1, 38] == analysis.EXPLODING  # that step's epoch


def test_a_point_that_does_not_read_back_leaves_the_zoom_on_the_right_steps(
        tmp_path, plugin_client, monkeypatch):
    """A point of the tag with another shape (a crafted record, another layout under the same
    tag) is left out and reported; the steps after it keep their own classes in a zoom."""
    from support import summary_value, tensor_proto, write_event_file

    _write(tmp_path / "run", 0, 500, seed=5)
    write_event_file(tmp_path / "run", [
        (500, [summary_value("gradients", tensor_proto(1, (2, 2), float_val=[1.0] * 4))])],
        name="events.out.tfevents.9999999999.zz")
    _write(tmp_path / "run", 501, 900, seed=6)
    client = plugin_client(str(tmp_path))
    long = _get(client, "heatmap", True, monkeypatch, stat="l2_norm", first_step=495,
                last_step=510)
    short = _get(client, "heatmap", False, monkeypatch, stat="l2_norm", first_step=495,
                 last_step=510)
    assert 500 not in long["steps"] and long["classes"] == short["classes"]
    assert long["values"] == short["values"]
    assert any("left out" in sentence for sentence in long["damage"])


def _fed_rows(monkeypatch):
    """The rows the plugin judges itself from now on (`Digest.feed`; not the writers' digests),
    counted."""
    fed = []
    real_feed = digest.Digest.feed

    def counted(self, rows, **options):
        if not threading.current_thread().name.startswith("tensorboard-gradients digest"):
            fed.append(len(rows.steps))
        return real_feed(self, rows, **options)

    monkeypatch.setattr(digest.Digest, "feed", counted)
    return fed


def test_a_run_a_restarted_job_wrote_on_costs_only_the_new_steps(written_logdir, plugin_client,
                                                                  monkeypatch):
    """Another writer's steps after the records (a restarted job: another file, with records
    of its own that start from its own first step) are not in the first writer's digest: the
    plugin takes that digest up where its records leave off (`Digest.continued`) and judges
    the new steps only, in the request that finds them; the answer is the whole run's."""
    client = plugin_client(str(written_logdir))
    with _plugin_busy(client, monkeypatch, busy=False) as fed:
        assert _get(client, "alerts", True, monkeypatch)["steps_to_read"] == 0
        _write(written_logdir / "run", STEPS, STEPS + 1100, seed=2, digest=True)
        client.reload()
        answers_ = {route: _get(client, route, True, monkeypatch, **params)
                    for route, params in (("alerts", {}), ("heatmap", {"stat": "l2_norm"}))}
        assert sum(fed) == 1100  # the new steps, not the 1,300 before them
    assert answers_["alerts"]["steps_to_read"] == answers_["heatmap"]["steps_to_read"] == 0
    assert answers_["heatmap"]["last_steps"][-1] == STEPS + 1100 - 1
    assert answers_["alerts"] == _get(client, "alerts", False, monkeypatch)
    _assert_routes_answer_as_the_run_read_whole(client, monkeypatch, STEPS + 1100)


@pytest.mark.parametrize("why", ["many new steps", "busy", "no state"])
def test_a_run_a_restarted_job_wrote_on_answers_from_the_writers_digest_until_read(
        written_logdir, plugin_client, monkeypatch, why):
    """When the new steps are many (more than `CONTINUE_IN_REQUEST_STEPS`), or the plugin's
    background read holds the digest, or the records hold no state to go on from (the
    writer's digest cannot be taken up: the plugin reads every step), the answers are the
    writer's digest's at once, saying how many steps are still to read; then the whole
    run's."""
    if why == "many new steps":
        monkeypatch.setattr(local_tag, "CONTINUE_IN_REQUEST_STEPS", 500)
    if why == "no state":
        def refused(*args, **kwargs):
            raise ValueError("the digest records hold no state to go on from")

        monkeypatch.setattr(digest.Digest, "continued", refused)
    client = plugin_client(str(written_logdir))
    with _plugin_busy(client, monkeypatch, busy=why == "busy") as fed:
        first = _get(client, "alerts", True, monkeypatch)
        _write(written_logdir / "run", STEPS, STEPS + 1100, seed=2, digest=True)
        client.reload()
        if why != "busy":  # the background reads it at once: hold it
            for long_run in _long_runs_of(client).values():
                assert long_run._feeding.acquire(blocking=False)
        partial = _get(client, "alerts", True, monkeypatch)
        heatmap_ = _get(client, "heatmap", True, monkeypatch, stat="l2_norm")
        if why != "busy":
            for long_run in _long_runs_of(client).values():
                long_run._feeding.release()
    assert first["steps_to_read"] == 0
    assert partial["alerts"] == first["alerts"] and partial["steps_to_read"] == 1100
    assert "1,300 of its 2,400 logged steps" in partial["sampled"]
    assert heatmap_["last_steps"][-1] == STEPS - 1 and heatmap_["steps_to_read"] == 1100
    whole = _until_read(client, monkeypatch, "alerts")
    assert whole == _get(client, "alerts", False, monkeypatch)
    # Read once, in the background: from the writer's digest on, or every step.
    assert sum(fed) == (STEPS + 1100 if why == "no state" else 1100)


def _until_read(client, monkeypatch, route, **params):
    """The route's answer once it says every step is read (asked every 0.1 s, up to 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        answer = _get(client, route, True, monkeypatch, **params)
        if answer["steps_to_read"] == 0 or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def test_a_writer_that_goes_on_after_close_keeps_one_digest_over_its_files(
        tmp_path, plugin_client, monkeypatch):
    """A writer closed and written to again (a new event file) goes on with the same digest:
    the plugin judges no step of the grown run either."""
    writer = tg.GradientWriter(str(tmp_path / "run"))
    _write(None, 0, STEPS, seed=1, writer=writer)
    _write(None, STEPS, 2 * STEPS, seed=2, writer=writer)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch) as fed:
        long = _get(client, "alerts", True, monkeypatch)
        assert long == _get(client, "alerts", False, monkeypatch) and long["steps_to_read"] == 0
        _assert_hides_no_step(client, monkeypatch)
        long = _get(client, "heatmap", True, monkeypatch, stat="l2_norm", axis="epoch")
        short = _get(client, "heatmap", False, monkeypatch, stat="l2_norm", axis="epoch")
        assert (long["steps"], long["classes"]) == (short["steps"], short["classes"])
        assert fed == []


@pytest.mark.parametrize("how", ["rewritten", "resumed_with_records", "restarted_from_scratch",
                                 "out_of_order"])
def test_steps_written_again_are_never_answered_from_a_stale_digest(
        tmp_path, plugin_client, monkeypatch, how):
    """A job restarted from a checkpoint (or from scratch) writes steps again, with records of
    its own when it wrote 1,000 steps: the steps are read from another file than the first
    job's records, and records of two writers never join. One writer writing a step out of
    order voids its own records. Either way the answers are those of the run read whole."""
    if how == "rewritten":
        _write(tmp_path / "run", 0, STEPS, seed=1, digest=True)
        _write(tmp_path / "run", 600, 700, seed=3, digest=True)
    elif how == "resumed_with_records":
        _write(tmp_path / "run", 0, 2 * STEPS, seed=1, digest=True)
        _write(tmp_path / "run", 500, 1600, seed=3, digest=True)
    elif how == "restarted_from_scratch":
        _write(tmp_path / "run", 0, 2 * STEPS, seed=1, digest=True)
        _write(tmp_path / "run", 0, 2000, seed=3, digest=True)
    else:
        writer = tg.GradientWriter(str(tmp_path / "run"))
        _write(None, 0, STEPS, seed=1, writer=writer)
        _write(None, 600, 700, seed=3, writer=writer)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch) as fed:
        partial = _get(client, "alerts", True, monkeypatch)
    steps = _get(client, "runs", True, monkeypatch)["run"]["gradients"]["steps"]
    if how == "restarted_from_scratch":  # the new job's records cover its steps 0-1999
        assert partial["steps_to_read"] == steps - 2000
    else:
        assert partial["steps_to_read"] == steps and partial["alerts"] == []
    assert _until_read(client, monkeypatch, "alerts") == _get(client, "alerts", False,
                                                               monkeypatch)
    long = _get(client, "heatmap", True, monkeypatch, stat="l2_norm", first_step=490,
                last_step=1010)
    assert long == _get(client, "heatmap", False, monkeypatch, stat="l2_norm", first_step=490,
                        last_step=1010)
    # The new job's digest is taken up: only the old job's later steps are judged.
    assert sum(fed) == (steps - 2000 if how == "restarted_from_scratch" else steps)


def test_a_request_waiting_for_a_background_read_does_not_hold_it_back():
    """Background reads pause while requests are answered, but not for a request that is
    itself waiting for that read (non-default thresholds): it would wait for every pause."""
    with traffic.REQUESTS.answering():
        with traffic.REQUESTS.waiting():
            started = time.monotonic()
            traffic.REQUESTS.wait_until_idle()
            assert time.monotonic() - started < traffic.YIELD_SECONDS / 2
        started = time.monotonic()
        traffic.REQUESTS.wait_until_idle()  # a request being answered: the read waits
        assert time.monotonic() - started >= traffic.YIELD_SECONDS * 0.9


def test_a_damaged_digest_record_leaves_the_records_before_it(tmp_path, plugin_client,
                                                               monkeypatch):
    """A digest record failing its checksum is left out: the records before it still answer
    for their steps at once, and the plugin reads the run for the rest."""
    from tensorboard_gradients.format import metadata
    from tensorboard_gradients.server.store import event_scan

    _write(tmp_path / "run", 0, STEPS, seed=1, digest=True)
    records = event_scan.EventFileIntegrity(str(tmp_path)).located(
        "run", metadata.digest_tag("gradients"))
    assert len(records.steps) == 2  # at 1,000 steps and at close
    path, offset, _ = records.locations[-1]
    with open(path, "r+b") as file:  # a byte of the last record's data
        file.seek(offset + 40)
        byte = file.read(1)
        file.seek(offset + 40)
        file.write(bytes([byte[0] ^ 0xFF]))
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch):
        partial = _get(client, "alerts", True, monkeypatch)
    assert partial["steps_to_read"] == STEPS - 1000
    whole = _until_read(client, monkeypatch, "alerts")
    assert whole == _get(client, "alerts", False, monkeypatch) and whole["steps_to_read"] == 0


def _tampered_records(monkeypatch, change):
    """Digest records written from now on pass through ``change(arrays)`` (a crafted file);
    returns the real `Digest.record`."""
    real = digest.Digest.record

    def record(self, since):
        arrays, written = real(self, since)
        change(arrays)
        return arrays, written

    monkeypatch.setattr(digest.Digest, "record", record)
    return real


def _json_field(name, field, value):
    def change(arrays):
        items = json.loads(arrays[name].tobytes())
        for item in items:
            item[field] = value
        arrays[name] = np.frombuffer(json.dumps(items).encode(), np.uint8)
    return change


CRAFTED_STATES = {
    "last step": lambda arrays: arrays.update(stream_last_step=np.int64(10**9)),
    "severity": _json_field("stream_findings", "severity", "bogus"),
    "detail without its reducer": _json_field("stream_findings", "detail_worst", None),
    "block steps 0": lambda arrays: arrays.update(block_steps=np.int64(0)),
    "block steps 10**12": lambda arrays: arrays.update(block_steps=np.int64(10**12)),
    "kept from the first row": lambda arrays: arrays.update(stream_kept_from=np.int64(0)),
    "carried of another width": lambda arrays: arrays.update(
        {"carried.variables.0": np.zeros(3, np.float32)}),
    "carried twice": lambda arrays: arrays.update({"carried.variables": np.int64(3)}),
    "classes out of range": lambda arrays: arrays.update(
        stream_provisional_classes=np.full_like(arrays["stream_provisional_classes"], 99)),
}


@pytest.mark.parametrize("crafted", list(CRAFTED_STATES))
def test_crafted_digest_records_never_break_or_hang_the_run(tmp_path, plugin_client,
                                                            monkeypatch, crafted):
    """Records whose state was crafted are refused when taken up (or restored), never raised
    into a request, never looping: every answer is a 200, and once the plugin has read the
    steps itself, the run read whole."""
    real = _tampered_records(monkeypatch, CRAFTED_STATES[crafted])
    _write(tmp_path / "run", 0, STEPS, seed=1, digest=True)
    monkeypatch.setattr(digest.Digest, "record", real)
    _write(tmp_path / "run", STEPS, STEPS + 300, seed=2, digest=True)  # a restarted job
    client = plugin_client(str(tmp_path))
    codes = []

    def ask():
        for route in ("alerts", "heatmap?stat=l2_norm", "alerts"):
            path, _, query = route.partition("?")
            _get(client, "runs", True, monkeypatch)
            response = client.get(BASE + path + "?run=run&tag=gradients&" + query)
            codes.append(response.status_code)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(timeout=60)
    assert not asking.is_alive() and codes == [200, 200, 200]
    assert _until_read(client, monkeypatch, "alerts") == _get(client, "alerts", False,
                                                               monkeypatch)


def test_a_step_written_again_before_its_void_is_never_answered_from_a_stale_digest(
        tmp_path, plugin_client, monkeypatch):
    """The same job writes a step again after the record covering it; the plugin looks before
    the writer's void record is written. The step, written after that record, is not covered
    by it: the answers are the run read whole, then and after the void."""
    from tensorboard_gradients.format import digest_feed

    voids = []
    real_void = digest_feed.DigestFeed._void
    monkeypatch.setattr(digest_feed.DigestFeed, "_void", lambda self: voids.append(self))
    writer = tg.GradientWriter(str(tmp_path / "run"), digest=True)
    rng, scale = np.random.default_rng(1), 10 ** np.linspace(-3, -1, VARIABLES)
    for step in range(1100):
        writer.write(step, _gradients(rng, step, scale))
    for feed in writer._feeds.values():  # its record of the first 1,000 steps is written
        feed.wait()
    grown = {name: g * 1e6 for name, g in _gradients(rng, 500, scale).items()}
    writer.write(500, grown)  # written again: exploding
    writer.flush()
    client = plugin_client(str(tmp_path))
    assert _until_read(client, monkeypatch, "alerts") == _get(client, "alerts", False,
                                                               monkeypatch)
    for feed in voids:
        real_void(feed)
    writer.close()
    client.reload()
    whole = _until_read(client, monkeypatch, "alerts")
    assert whole == _get(client, "alerts", False, monkeypatch)
    assert any(a["rule"] == "absolute" and a["first_step"] <= 500 <= a["last_step"]
               for a in whole["alerts"])
