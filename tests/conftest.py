"""Shared test helpers: an independent numpy reference for every statistic."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest


def reference_stats(gradient, weight=None):
    """The stats of one dense gradient, computed the obvious way in float64 (not our code)."""
    g = np.asarray(gradient, dtype=np.float64).reshape(-1)
    finite = g[np.isfinite(g)]
    n = finite.size
    row = {
        "l2_norm": np.sqrt(np.sum(finite**2)),
        "mean": finite.mean() if n else np.nan,
        "std": finite.std() if n else np.nan,
        "min": finite.min() if n else np.nan,
        "max": finite.max() if n else np.nan,
        "abs_max": np.abs(finite).max() if n else np.nan,
        "mean_abs": np.abs(finite).mean() if n else np.nan,
        "zero_fraction": np.mean(g == 0) if g.size else np.nan,
        "nan_count": np.isnan(g).sum(),
        "inf_count": np.isinf(g).sum(),
        "size": g.size,
    }
    if weight is not None:
        w = np.asarray(weight, dtype=np.float64).reshape(-1)
        row["weight_l2_norm"] = np.sqrt(np.sum(w**2))
    return row


def reference_histogram(gradient):
    """Counts of |g| per column, by explicit comparisons against the documented edges."""
    from tensorboard_gradients import metadata

    a = np.abs(np.asarray(gradient, dtype=np.float64).reshape(-1))
    edges = 10.0 ** np.array(metadata.HISTOGRAM_LOG10_EDGES)
    counts = np.zeros(metadata.HISTOGRAM_BINS)
    counts[metadata.HIST_ZERO] = np.sum(a == 0)
    counts[metadata.HIST_NAN] = np.sum(np.isnan(a))
    counts[metadata.HIST_INF] = np.sum(np.isinf(a))
    finite = a[np.isfinite(a) & (a > 0)]
    counts[metadata.HIST_BELOW] = np.sum(finite < edges[0])
    counts[metadata.HIST_ABOVE] = np.sum(finite >= edges[-1])
    for i in range(len(edges) - 1):
        counts[metadata.HIST_FIRST_LOG_BIN + i] = np.sum((finite >= edges[i]) & (finite < edges[i + 1]))
    return counts


def assert_row_matches(series, step_index, variable, expected, rtol=2e-5):
    """Compares one logged row with `reference_stats` output, NaN where NaN is expected."""
    index = series.variables.index(variable)
    scale = expected["abs_max"] if np.isfinite(expected["abs_max"]) else 1.0
    for stat, want in expected.items():
        got = series.stat(stat)[step_index, index]
        if np.isnan(want):
            assert np.isnan(got), f"{variable} {stat}: expected NaN, got {got}"
        else:
            np.testing.assert_allclose(
                got, want, rtol=rtol, atol=1e-6 * max(1.0, scale), err_msg=f"{variable} {stat}"
            )


@pytest.fixture
def logdir(tmp_path):
    return str(tmp_path / "logs")


@pytest.fixture(scope="session")
def plugin_client():
    """``plugin_client(logdir)``: a werkzeug client of TensorBoard's app with our plugin, over the
    Python loader's `MultiplexerDataProvider` (call ``.reload()`` on it after writing more)."""
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from tensorboard_gradients import plugin

    def make(logdir):
        multiplexer = plugin_event_multiplexer.EventMultiplexer(
            tensor_size_guidance={"gradients": 0}
        )
        multiplexer.AddRunsFromDirectory(logdir)
        multiplexer.Reload()
        provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
        context = base_plugin.TBContext(logdir=logdir, data_provider=provider)
        app = application.TensorBoardWSGI(
            [plugin.GradientsLoader().load(context)], data_provider=provider
        )
        client = werkzeug_test.Client(app)
        client.reload = multiplexer.Reload
        return client

    return make


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """``(logdir, stdout)`` of ``demo/train.py --quick``, run once per session as a user runs it."""
    from support import run_demo

    logdir = tmp_path_factory.mktemp("demo")
    return logdir, run_demo(logdir)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium driven by Playwright, shared by the browser tests of the session."""
    from playwright.sync_api import sync_playwright

    from support import launch_chromium

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()
