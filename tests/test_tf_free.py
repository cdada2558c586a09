"""Writer, reader, diagnosis, CLI and plugin routes in a process where TensorFlow cannot be imported."""

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, importlib.metadata, json, sys, tempfile, argparse

    class NoFrameworks(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("tensorflow", "torch", "keras"):
                raise ImportError("blocked for this test: " + name)

    sys.meta_path.insert(0, NoFrameworks())
    try:
        import tensorflow
        raise SystemExit("tensorflow should not be importable here")
    except ImportError:
        pass

    import numpy as np
    import tensorboard_gradients as tg

    logdir = tempfile.mkdtemp()
    with tg.GradientWriter(logdir) as writer:
        for step in range(5):
            writer.write(step, {"fc1/weight": np.full((3, 2), step, np.float32), "fc1/bias": None},
                         histograms=True)
    series = tg.read_logdir(logdir)["."]["gradients"]

    loader_class = next(
        e for e in importlib.metadata.entry_points(group="tensorboard_plugins") if e.name == "gradients"
    ).load()
    flags = argparse.Namespace(samples_per_plugin={})
    loader_class().fix_flags(flags)

    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test
    from tensorboard_gradients import cli

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradients": 0})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    plugin = loader_class().load(base_plugin.TBContext(logdir=logdir, data_provider=provider))
    client = werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))
    heatmap = json.loads(client.get(
        "/data/plugin/gradients/heatmap?run=.&tag=gradients&stat=l2_norm").get_data())
    cli_status = cli.main(["diagnose", logdir, "--json"])

    print(json.dumps({
        "steps": series.steps.tolist(),
        "norms": series.stat("l2_norm")[:, 0].tolist(),
        "missing": series.missing[:, 1].tolist(),
        "histogram_total": float(series.histograms.counts[-1, 0].sum()),
        "samples": flags.samples_per_plugin,
        "heatmap_classes": heatmap["classes"],
        "alerts": [a.kind for a in tg.diagnose(series)],
        "cli_status": cli_status,
        "frameworks_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "torch", "keras")),
    }))
    """
)


def test_writer_reader_and_entry_point_work_without_tensorflow():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == [0, 1, 2, 3, 4]
    assert result["norms"] == pytest.approx([step * 6**0.5 for step in range(5)], rel=1e-6)
    assert result["missing"] == [True] * 5
    assert result["histogram_total"] == 6
    assert result["samples"] == {"gradients": 0, "gradients_digest": 1}
    assert result["heatmap_classes"] == [["ok"] * 5, ["missing"] * 5]
    # fc1/bias got no gradient at any step: a finding; only --fail-on would make it status 1.
    assert result["alerts"] == ["never_updated"] and result["cli_status"] == 0
    assert result["frameworks_loaded"] == []
