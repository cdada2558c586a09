"""Logdirs in buckets (issue 37): `read_logdir` and `tensorboard-gradients diagnose` read
``s3://`` and ``gs://`` URLs through fsspec, against real servers on loopback (moto's S3 server,
a GCS emulator: `object_stores`), and answer exactly as for the same run read from disk."""

import dataclasses
import json
import os
import subprocess
import time
import urllib.parse

import numpy as np
import pytest
import torch

import tensorboard_gradients as tg
from object_stores import BUCKET, SCHEMES, SECRET, moto_command, running_stores, server
from processes import free_ports
from tensorboard_gradients.format import reader, storage
from tensorboard_gradients.torch import GradientMonitor
from test_cli import command

# The CLI's answers below, on a dead endpoint, come within the store's connect timeout and its
# three tries (storage.TIMEOUT_SECONDS): far under this.
CLI_TIMEOUT_S = 120


def train_torch_run(log_dir, steps=60):
    """A real PyTorch run: a small MLP trained with Adam under the monitor, with histograms."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    with GradientMonitor(model, log_dir, histograms_every_n_steps=20) as monitor:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            monitor.step(loss=loss)
            optimizer.step()


def write_broken_run(log_dir, steps=80):
    """Normal gradients with an Inf entry in one kernel from step 50 on: a critical alert."""
    rng = np.random.default_rng(1)
    with tg.GradientWriter(log_dir) as writer:
        for step in range(steps):
            grads = {f"dense_{i}/kernel": rng.normal(size=(8, 8)) for i in range(3)}
            if step >= 50:
                grads["dense_1/kernel"][0, 0] = np.inf
            writer.write(step, grads)


@pytest.fixture(scope="module")
def local_logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    train_torch_run(str(root / "torch"))
    write_broken_run(str(root / "nested" / "broken"))
    return str(root)


@pytest.fixture(scope="module")
def stores(local_logdir):
    with running_stores() as started:
        for scheme in SCHEMES:
            started.upload(local_logdir, scheme, "experiment")
        yield started


def assert_same_series(here, there, wall_times=True):
    """Every field of every series equal: the bytes read back, NaN included, not recomputed
    (``wall_times=False``: all but the wall times, for the same run written twice)."""
    assert {run: set(tags) for run, tags in here.items()} == \
        {run: set(tags) for run, tags in there.items()}
    fields = dataclasses.asdict if wall_times else _without_wall_times
    for run, tags in here.items():
        for tag, series in tags.items():
            np.testing.assert_equal(fields(series), fields(there[run][tag]))


def _without_wall_times(value):
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {key: _without_wall_times(item) for key, item in value.items()
                if key != "wall_times"}
    return value


@pytest.mark.parametrize("scheme", SCHEMES)
def test_read_logdir_of_a_bucket_equals_the_local_read(stores, local_logdir, scheme):
    url = f"{scheme}://{BUCKET}/experiment"
    local = reader.read_logdir(local_logdir)
    assert set(local) == {"torch", "nested/broken"}
    assert len(local["torch"]["gradients"].steps) == 60  # every step, none sampled
    assert_same_series(local, reader.read_logdir(url))
    assert_same_series(local, reader.read_logdir(url + "/"))  # a trailing slash is the same


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cli_diagnose_of_a_bucket_answers_as_for_the_local_logdir(stores, local_logdir, scheme):
    url = f"{scheme}://{BUCKET}/experiment"
    environment = stores.child_environment()
    local = subprocess.run([command(), "diagnose", local_logdir, "--json"], capture_output=True,
                           text=True, timeout=CLI_TIMEOUT_S, env=environment)
    remote = subprocess.run([command(), "diagnose", url, "--json"], capture_output=True,
                            text=True, timeout=CLI_TIMEOUT_S, env=environment)
    assert local.returncode == remote.returncode == 1, remote.stderr  # the Inf fails the gate
    assert json.loads(local.stdout)["alerts"] == json.loads(remote.stdout)["alerts"]
    assert any(a["kind"] == "nonfinite" and a["run"] == "nested/broken"
               for a in json.loads(remote.stdout)["alerts"])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_missing_bucket_or_prefix_is_no_such_logdir(stores, scheme):
    for url in (f"{scheme}://no-such-bucket/logs", f"{scheme}://{BUCKET}/no-such-prefix"):
        with pytest.raises(FileNotFoundError, match="no such log directory"):
            reader.read_logdir(url)
        result = subprocess.run([command(), "diagnose", url], capture_output=True, text=True,
                                timeout=CLI_TIMEOUT_S, env=stores.child_environment())
        assert result.returncode == 2
        assert url in result.stderr and "Traceback" not in result.stderr


def test_an_endpoint_that_does_not_answer_fails_fast_naming_the_url(stores):
    dead_port, = free_ports(1)  # bound and released: nothing listens there
    environment = stores.child_environment(AWS_ENDPOINT_URL=f"http://127.0.0.1:{dead_port}")
    url = f"s3://{BUCKET}/experiment"
    started = time.monotonic()
    result = subprocess.run([command(), "diagnose", url], capture_output=True, text=True,
                            timeout=CLI_TIMEOUT_S, env=environment)
    assert result.returncode == 3, result.stderr
    assert f"cannot read '{url}'" in result.stderr and "Traceback" not in result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert time.monotonic() - started < CLI_TIMEOUT_S


def test_refused_credentials_are_permission_denied_naming_the_url(stores):
    port, = free_ports(1)
    # moto checks every request's credentials from the first: ours name no user it knows.
    checking = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="0")
    url = f"s3://{BUCKET}/experiment"
    with server(moto_command(port), port, "moto checking credentials", env=checking):
        environment = stores.child_environment(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        result = subprocess.run([command(), "diagnose", url], capture_output=True, text=True,
                                timeout=CLI_TIMEOUT_S, env=environment)
    assert result.returncode == 3, result.stderr
    assert f"permission denied reading '{url}'" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stderr + result.stdout


def test_an_object_deleted_while_read_is_reported_and_the_rest_read(stores, local_logdir,
                                                                     monkeypatch):
    url = stores.upload(local_logdir, "s3", "deleted-while-read")
    scan = reader.scan_logdir_report(url)  # every step located, none decoded yet
    fs = stores.filesystem("s3")
    [deleted] = fs.find(f"{BUCKET}/deleted-while-read/torch")
    fs.rm(deleted)
    # The records are read back from the store, as a long run's are: a small run's would come
    # from the blocks its scan just read (`storage.BlockCache.cached`), the store not asked.
    monkeypatch.setattr(storage, "BLOCKS", storage.BlockCache(256 << 20))
    before = len(scan.problems)
    assert len(scan.runs["torch"]["gradients"].series().steps) == 0  # its only file is gone
    problems = scan.problems[before:]  # reading back adds what it could not read
    assert problems and all(p.kind == reader.DAMAGED and p.path == f"s3://{deleted}"
                            for p in problems)
    assert "no such log directory or file" in problems[0].message
    broken = scan.runs["nested/broken"]["gradients"].series()
    assert len(broken.steps) == 80  # the other run reads whole
    assert SECRET not in repr(problems)


def test_the_readers_name_no_credentials_in_a_url():

    assert storage.shown("s3://key:secret@bucket/logs") == "s3://bucket/logs"
    with pytest.raises(FileNotFoundError) as raised:
        reader.read_logdir("memory://user:secret@nowhere/logs")
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize("path", ["file://{root}", "{root}"])
def test_file_urls_and_paths_read_alike(local_logdir, path):
    assert_same_series(reader.read_logdir(local_logdir),
                       reader.read_logdir(path.format(root=local_logdir)))


def gradients_app(logdir):
    """TensorBoard's WSGI app with the plugin on ``logdir``, TensorBoard's own loader given no
    runs: every answer below comes from the plugin's own reading of the logdir."""
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from tensorboard_gradients.server import plugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    context = base_plugin.TBContext(logdir=logdir, data_provider=provider)
    return werkzeug_test.Client(application.TensorBoardWSGI(
        [plugin.GradientsLoader().load(context)], data_provider=provider))


def answers_of(client):
    """The runs, and per stats tag its heatmap, alerts, a series and a histogram, as the routes
    answer."""
    base = "/data/plugin/gradients/"

    def get(route):
        response = client.get(base + route)
        assert response.status_code == 200, (route, response.get_data()[:300])
        return json.loads(response.get_data())

    runs = get("runs")
    found = {"runs": runs}
    for run, tags in runs.items():
        for tag in tags:
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            found[(run, tag)] = [get(f"heatmap?{query}&stat=l2_norm"), get(f"alerts?{query}"),
                                 get(f"series?{query}&variable_index=0"),
                                 get(f"histogram?{query}&variable_index=0&step=20")
                                 if tags[tag]["histograms"] else None]
    return found


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_plugin_serves_a_bucket_as_the_same_logdir_on_disk(stores, local_logdir, scheme):
    local = answers_of(gradients_app(local_logdir))
    assert len(local) == 3, local["runs"]  # both runs' tags answered
    assert answers_of(gradients_app(f"{scheme}://{BUCKET}/experiment")) == local


# TensorBoard's loaders on each scheme: its Python loader reads s3:// (boto3, S3_ENDPOINT) and
# gs:// (fsspec); its Rust loader reads gs:// only, and not from an emulator: the tab is then the
# plugin's own reading (`GradientsPlugin.is_active`). `auto`, TensorBoard's default, falls back
# to the Python loader for s3://, where `true` makes TensorBoard refuse to start.
SERVED = [("s3", "false"), ("s3", "auto"), ("gs", "false"), ("gs", "true")]


@pytest.mark.parametrize("scheme,load_fast", SERVED)
def test_a_real_tensorboard_shows_the_tab_for_a_bucket(stores, local_logdir, browser, scheme,
                                                       load_fast):
    from support import Tab, TensorBoard, get_json

    local = answers_of(gradients_app(local_logdir))
    with TensorBoard(f"{scheme}://{BUCKET}/experiment", load_fast=load_fast) as served:
        served.wait_for(lambda: served.runs() == local["runs"], "the bucket's runs")
        assert get_json(served.base + "/data/plugins_listing")["gradients"]["enabled"]
        query = urllib.parse.urlencode({"run": "nested/broken", "tag": "gradients"})
        assert get_json(f"{served.base}/data/plugin/gradients/alerts?{query}") == \
            local[("nested/broken", "gradients")][1]
        tab = Tab(browser, served.base)  # Chromium: the tab opens on the most severe run
        tab.wait_drawn()
        assert tab.page.evaluate("window.gradientsApp.matrix.run") == "nested/broken"
        assert any(alert["kind"] == "nonfinite" for alert in tab.wait_alerts())
        tab.close()


def test_a_bucket_that_stops_answering_is_logged_once_until_it_answers_again(stores, caplog,
                                                                             monkeypatch):
    import s3fs

    from tensorboard_gradients.server.store import event_scan

    checker = event_scan.EventFileIntegrity(f"s3://{BUCKET}/experiment")
    assert checker.runs() == ["nested/broken", "torch"]
    dead_port, = free_ports(1)
    with monkeypatch.context() as outage:
        outage.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead_port}")
        s3fs.S3FileSystem.clear_instance_cache()  # a filesystem made earlier keeps its endpoint
        with caplog.at_level("WARNING", logger=event_scan.__name__):
            assert [checker.runs() for _ in range(3)] == [[], [], []]  # the tab asks again
    s3fs.S3FileSystem.clear_instance_cache()
    with caplog.at_level("WARNING", logger=event_scan.__name__):
        assert checker.runs() == ["nested/broken", "torch"]
    said = [record.getMessage() for record in caplog.records
            if record.name == event_scan.__name__]
    assert len(said) == 2 and "cannot list" in said[0] and "again" in said[1]


def test_the_tab_says_why_a_bucket_that_does_not_answer_shows_nothing(stores, monkeypatch):
    import s3fs

    dead_port, = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead_port}")
    s3fs.S3FileSystem.clear_instance_cache()  # a filesystem made earlier keeps its endpoint
    try:
        url = f"s3://{BUCKET}/never-answered"
        client = gradients_app(url)
        runs = client.get("/data/plugin/gradients/runs")
        assert runs.status_code == 200 and json.loads(runs.get_data()) == {}
        inventory = json.loads(client.get("/data/plugin/gradients/inventory").get_data())
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert f"it could not be read (cannot read '{url}'" in inventory["found"]
    assert "check the store's credentials and endpoint" in inventory["found"]
    assert SECRET not in json.dumps(inventory)


def test_a_refresh_downloads_only_the_new_object(stores, local_logdir, tmp_path, monkeypatch):

    class RecordingBlocks(storage.BlockCache):
        """Which objects are downloaded (a read of a block kept is not)."""

        def __init__(self):
            super().__init__(64 * 1024 * 1024)
            self.fetched = set()

        def fetch(self, file, index):
            self.fetched.add(file.url)
            return super().fetch(file, index)

    blocks = RecordingBlocks()
    monkeypatch.setattr(storage, "BLOCKS", blocks)
    url = stores.upload(local_logdir, "s3", "refreshed")
    client = gradients_app(url)
    query = {"run": "nested/broken", "tag": "gradients", "stat": "l2_norm"}

    def last_step():
        heatmap = json.loads(client.get("/data/plugin/gradients/heatmap",
                                        query_string=query).get_data())
        return heatmap["last_steps"][-1]

    assert last_step() == 79
    rng = np.random.default_rng(2)  # 20 more steps of the same variables, by a new writer
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(80, 100):
            writer.write(step, {f"dense_{i}/kernel": rng.normal(size=(8, 8)) for i in range(3)})
    [new_file] = os.listdir(tmp_path)
    stores.filesystem("s3").put_file(str(tmp_path / new_file),
                                     f"{BUCKET}/refreshed/nested/broken/{new_file}")
    blocks.fetched.clear()
    assert last_step() == 99
    assert blocks.fetched == {f"{url}/nested/broken/{new_file}"}


def test_tensorboard_does_not_wait_long_for_a_bucket_that_keeps_retrying(monkeypatch):
    """A GCS endpoint that refuses every connection: gcsfs retries with backoff for minutes;
    the plugin gives it `START_SECONDS` and says why it does not read the bucket itself."""
    import gcsfs


    dead_port, = free_ports(1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{dead_port}")
    monkeypatch.setattr(storage, "START_SECONDS", 2.0)
    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        url = f"gs://{BUCKET}/retried-forever"
        started = time.monotonic()
        client = gradients_app(url)
        assert time.monotonic() - started < 10
        inventory = json.loads(client.get("/data/plugin/gradients/inventory").get_data())
    finally:
        gcsfs.GCSFileSystem.clear_instance_cache()
    assert f"cannot read '{url}': no answer in 2 s" in inventory["found"]
