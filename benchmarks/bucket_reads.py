"""A long run read from a bucket (issue 37), beside the same run read from disk.

    python benchmarks/bucket_reads.py [--quick] [--variables N] [--steps N] [--workdir DIR]
        [--schemes s3,gs]

Writes `long_run`'s run (V variables x S steps, spikes and a NaN planted; reused from
``--workdir``), writes it again into moto's S3 server and a GCS emulator started on loopback (the
test suite's, ``tests/object_stores.py``) as a writer to a bucket does (segments and their
indexes, `format.segments`), then, for the directory and each bucket, measures:

* ``tensorboard-gradients diagnose --json``: its wall time, and whether every plant was alerted;
* the plugin (TensorBoard's WSGI app in this process, the plugin reading the logdir itself, as
  in a real TensorBoard): the first overview heatmap (4,000 columns) from nothing read, its
  answer while the long run is still being read ("partial") and until it is complete, with the
  bytes fetched from the store meanwhile (`storage.DOWNLOADED.value`);
* the refresh: 1,000 steps appended as a new event file (a new object in the bucket, as a
  restarted job or a new segment writes), then the time until a heatmap holds them and the
  bytes fetched for it: in proportion to the new steps, not the whole run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import _common
import long_run
from tensorboard_gradients.format import event_files, segments, storage

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import object_stores  # noqa: E402 - the test suite's loopback stores, one way to start them

FULL = dict(variables=1000, steps=10_000, histogram_every=100, spikes=20, seed=0,
            append_steps=1000, overview_columns=4000, workdir=None, timeout=1800.0,
            schemes=object_stores.SCHEMES)
QUICK = dict(FULL, variables=100, steps=3000)
PREFIX = "long-run"

ABOUT = """\
A long run (`long_run`'s: V variables x S steps, spikes and a NaN planted) read from a local
directory, and from moto's S3 server and a GCS emulator, both on loopback, where it was written
as a writer to a bucket writes it (segments of 8 MiB, indexed 16 at a time): the CLI's `diagnose`,
the plugin's first overview heatmap from nothing read (4,000 columns; the plugin reads the logdir
itself, in TensorBoard's WSGI app in this process), and the refresh once 1,000 steps are
appended as a new object. Bytes fetched: what the plugin downloaded (`storage.DOWNLOADED.value`)."""

HOW_TO_READ = """\
How to read this: seconds, and MB fetched from the store (the directory's reads are not
counted). "first answer" is the first heatmap asked with nothing read, "complete" until an
answer holds every step (the tab asks again while an answer says steps are still to read);
"refresh" from the appended object's upload until a heatmap holds its steps. A bucket's first
answer downloads the segments' indexes and the records it reads back (the writer's digest), not
the run; the segments are verified in the background afterwards, so the refresh's MB count that
download too (the appended object, uploaded whole without an index, is read from its bytes).
"upload": writing the run into the store. Target of issue 37 at 1,000 x 100,000: the first
heatmap under 2 s from a local emulator (`--schemes gs --steps 100000`: NOTES.md)."""


def _app(logdir):
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from tensorboard_gradients.server import plugin

    provider = data_provider.MultiplexerDataProvider(
        plugin_event_multiplexer.EventMultiplexer(), logdir)
    context = base_plugin.TBContext(logdir=logdir, data_provider=provider)
    return werkzeug_test.Client(application.TensorBoardWSGI(
        [plugin.GradientsLoader().load(context)], data_provider=provider))


def _heatmap(client, columns):
    response = client.get(f"{long_run.PLUGIN}heatmap", query_string=dict(
        run=long_run.RUN, tag=long_run.TAG, stat=long_run.STAT, encoding="base64",
        max_steps=columns))
    if response.status_code != 200:
        raise RuntimeError(f"heatmap: {response.status_code} {response.get_data()[:200]}")
    return json.loads(response.get_data())


def _until_complete(client, settings, last_step):
    """(seconds to the first answer, seconds until an answer holds every step up to
    ``last_step``, that answer)."""
    start = time.perf_counter()
    heatmap = _heatmap(client, settings["overview_columns"])
    first = time.perf_counter() - start
    deadline = start + settings["timeout"]
    while heatmap["steps_to_read"] or heatmap["last_steps"][-1] != last_step:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"not complete after {settings['timeout']:g} s")
        time.sleep(0.25)
        heatmap = _heatmap(client, settings["overview_columns"])
    return first, time.perf_counter() - start, heatmap


def _diagnose(logdir, planted, environment, timeout):
    start = time.perf_counter()
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable),
                                        "tensorboard-gradients"), "diagnose", logdir, "--json"],
                          capture_output=True, text=True, timeout=timeout, env=environment)
    seconds = time.perf_counter() - start
    alerts = json.loads(done.stdout)["alerts"] if done.stdout else []
    return seconds, len(long_run.missed_in_alerts(alerts, planted))


def write_as_segments(run_dir, url):
    """The run's events written to ``url`` as a writer to a bucket writes them: segments that
    each describe their tags again, and their indexes (`format.segments`), uploaded as they
    end."""
    writer = segments.SegmentWriter(url)
    metadata_of, described = {}, set()
    for name in sorted(os.listdir(run_dir)):
        for event in event_files.read_events(os.path.join(run_dir, name)):
            if event.HasField("file_version"):
                continue  # each segment starts with its own
            if writer.starts_new_file:
                described = set()
            for value in event.summary.value:
                if value.HasField("metadata"):
                    metadata_of.setdefault(value.tag, value.metadata)
                elif value.tag in metadata_of and value.tag not in described:
                    value.metadata.CopyFrom(metadata_of[value.tag])
                described.add(value.tag)
            writer.write(event)
            writer.upload()
    writer.close()


def measure(logdir, planted, settings, environment, upload_new):
    """One row: the CLI, the first heatmap, the refresh (``upload_new()`` makes the appended
    steps visible at ``logdir``)."""
    row = {"logdir": logdir.split("://")[0] + "://" if "://" in logdir else "directory"}
    row["diagnose_s"], row["diagnose_missed"] = _diagnose(logdir, planted, environment,
                                                          settings["timeout"])
    steps = settings["steps"]
    client = _app(logdir)
    fetched = storage.DOWNLOADED.value
    row["first_s"], row["complete_s"], heatmap = _until_complete(client, settings, steps - 1)
    row["first_mb"] = (storage.DOWNLOADED.value - fetched) / 1e6
    row["heatmap_missed"] = len(long_run.missed_in_heatmap(heatmap, planted))
    fetched = storage.DOWNLOADED.value
    start = time.perf_counter()
    upload_new()
    _, row["refresh_s"], _ = _until_complete(client, settings, steps + settings["append_steps"] - 1)
    row["refresh_s"] = time.perf_counter() - start
    row["refresh_mb"] = (storage.DOWNLOADED.value - fetched) / 1e6
    return row


def collect(settings):
    config, workdir = _common.started(settings, "bucket_reads")
    run_dir, written = long_run.long_run_for(workdir, settings)
    planted = written.pop("planted")
    rows = []
    with tempfile.TemporaryDirectory() as scratch, object_stores.running_stores() as stores:
        environment = stores.child_environment()
        # The refresh's steps, written once: each logdir gets the same new file.
        appended = os.path.join(scratch, long_run.RUN)
        long_run.append_steps(appended, settings["steps"], settings["append_steps"],
                              settings["variables"], settings["histogram_every"],
                              settings["seed"])
        [new_file] = os.listdir(appended)
        local_root = os.path.join(scratch, "local")
        os.makedirs(os.path.join(local_root, long_run.RUN))
        for name in os.listdir(run_dir):
            os.link(os.path.join(run_dir, name), os.path.join(local_root, long_run.RUN, name))

        def add_locally():
            os.link(os.path.join(appended, new_file),
                    os.path.join(local_root, long_run.RUN, new_file))
        print("directory ...", flush=True)
        rows.append(measure(local_root, planted, settings, environment, add_locally))
        print(json.dumps(rows[-1]), flush=True)
        for scheme in settings["schemes"]:
            fs = stores.filesystem(scheme)
            if not fs.exists(object_stores.BUCKET):
                fs.mkdir(object_stores.BUCKET)
            url = f"{scheme}://{object_stores.BUCKET}/{PREFIX}"
            start = time.perf_counter()
            write_as_segments(run_dir, f"{url}/{long_run.RUN}")
            upload_s = time.perf_counter() - start

            def add_to_bucket(fs=fs):
                fs.put_file(os.path.join(appended, new_file),
                            f"{object_stores.BUCKET}/{PREFIX}/{long_run.RUN}/{new_file}")
            print(f"{scheme}:// ...", flush=True)
            rows.append(dict(measure(url, planted, settings, environment, add_to_bucket), upload_s=upload_s))
            print(json.dumps(rows[-1]), flush=True)
    config["run_mb"] = written["run_bytes"] / 1e6
    return {"config": config, "rows": rows}


def _seconds(value):
    return f"{value:.2f}" if value < 10 else f"{value:,.1f}"


def render(result):
    c = result["config"]
    header = (f"{c['variables']:,} variables x {c['steps']:,} steps ({c['run_mb']:,.0f} MB on "
              f"disk), {c['append_steps']:,} steps appended for the refresh.")
    rows = [[r["logdir"], _seconds(r["diagnose_s"]), _seconds(r["first_s"]),
             _seconds(r["complete_s"]), f"{r['first_mb']:,.0f}",
             _seconds(r["refresh_s"]), f"{r['refresh_mb']:,.1f}",
             f"{r['diagnose_missed']} / {r['heatmap_missed']}",
             _seconds(r["upload_s"]) if "upload_s" in r else ""]
            for r in result["rows"]]
    return header + "\n\n" + _common.table(
        ["logdir", "diagnose", "first answer", "complete", "MB fetched", "refresh",
         "refresh MB fetched", "plants missed (CLI / heatmap)", "upload"], rows, text_columns=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variables", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--workdir", help="where the run is generated and kept")
    parser.add_argument("--schemes", type=_common.parse_words,
                        help="the stores read (default s3,gs; moto reads a whole object for "
                             "each range: leave s3 out of a run of gigabytes)")
    _common.run_alone(_common.parse_args(parser, FULL, QUICK), FULL, collect, render)


if __name__ == "__main__":
    main()
