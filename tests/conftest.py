"""Shared test helpers: an independent numpy reference for every statistic."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tensorboard_gradients.format import columns


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


def reference_bins(gradient):
    """The histogram column of each |g| entry, by explicit comparisons against the documented
    edges (one array for many entries: test_histogram_bins asks for every key range's)."""
    from tensorboard_gradients.format import columns

    a = np.abs(np.asarray(gradient, dtype=np.float64).reshape(-1))
    edges = 10.0 ** np.array(columns.HISTOGRAM_LOG10_EDGES)
    bins = np.full(a.shape, -1)
    bins[a == 0] = columns.HIST_ZERO
    bins[np.isnan(a)] = columns.HIST_NAN
    bins[np.isinf(a)] = columns.HIST_INF
    finite = np.isfinite(a) & (a > 0)
    bins[finite & (a < edges[0])] = columns.HIST_BELOW
    bins[finite & (a >= edges[-1])] = columns.HIST_ABOVE
    for i in range(len(edges) - 1):
        bins[finite & (a >= edges[i]) & (a < edges[i + 1])] = columns.HIST_FIRST_LOG_BIN + i
    return bins


def reference_histogram(gradient):
    """Counts of |g| per column (`reference_bins`)."""
    from tensorboard_gradients.format import columns

    return np.bincount(reference_bins(gradient), minlength=columns.HISTOGRAM_BINS).astype(np.float64)


def norm_rtol(entries, dtype=np.float32):
    """Relative rounding bound of a norm (or any sum of non-negative terms) of ``entries`` values
    computed in ``dtype`` in any summation order: (n + 8) u, see `stat_tolerances`."""
    return float((entries + 8) * np.finfo(dtype).eps / 2)


def stat_tolerances(expected, dtype, input_rtol=0.0):
    """``{stat: absolute tolerance}`` for comparing logged stats with `reference_stats`.

    Derived from worst-case rounding bounds, not tuned to pass: with unit roundoff ``u`` of the
    computation dtype and ``n`` entries, a float sum of ``n`` terms in ANY order (XLA, pairwise,
    cascade, GPU trees) is off by at most ``(n - 1) u sum|terms|`` (Higham, "Accuracy and
    Stability of Numerical Algorithms", 2nd ed., eq. 4.4); ``gamma = (n + 8) u`` adds the few
    roundings around the sum (squaring, the 1/abs_max scaling, division, sqrt, storage).

    * mean_abs, weight_l2_norm: sums of non-negative terms, relative error <= gamma.
    * l2_norm: the sum of squares is ``M2 + sum * mean`` (`statistics._fast_reductions`): M2 is
      off by <= gamma M2 plus the mean's error squared, ``sum * mean`` by <= 2 gamma times the sum
      of squares (the sum's error is <= gamma sum|x| and ``|sum| sum|x| <= n sum x^2``,
      Cauchy-Schwarz), so the sum of squares by <= 3 gamma and its root by <= 1.5 gamma.
    * mean: a signed sum, error <= gamma * mean_abs (it need not be small RELATIVE to the mean).
    * std: two-pass, so the mean's error delta <= gamma * mean_abs enters only at second order:
      sqrt(M2 / n) with M2 = n (var + delta^2)(1 +- gamma) is within
      min(delta, delta^2 / (2 std)) + gamma * sqrt(std^2 + delta^2) of the std. The naive
      sqrt(E[x^2] - E[x]^2) is off by up to gamma E[x^2] / (2 std): for 64 entries with
      |mean| / std = 1e4 that is ~100x this bound, which is the bug it catches.
    * min, max, abs_max: exact up to two roundings (the cast, the stored float).
    * zero_fraction and the counts: exact up to one division.

    ``input_rtol``: how far the gradient entries themselves may differ from the reference's,
    when the reference gradient was recomputed by another graph (an eager tape vs the compiled
    train step round a K-term matmul differently, up to K u relative per entry). Each entry moving
    by input_rtol * |entry| moves a norm or mean_abs by input_rtol of itself, the mean by
    input_rtol * mean_abs, the std by at most input_rtol * (rms + mean_abs).
    """
    u = np.finfo(dtype).eps / 2
    n = max(float(expected["size"]), 1.0)
    gamma = (n + 8) * u
    mean_abs = expected["mean_abs"] if np.isfinite(expected["mean_abs"]) else 0.0
    rms = expected["l2_norm"] / np.sqrt(n)
    magnitude = lambda stat: abs(expected[stat]) if np.isfinite(expected[stat]) else 0.0  # noqa: E731
    tolerances = {
        "l2_norm": (1.5 * gamma + input_rtol) * magnitude("l2_norm"),
        "mean": (gamma + input_rtol) * mean_abs,
        "std": std_bound(gamma * mean_abs, magnitude("std"), gamma) + input_rtol * (rms + mean_abs),
        "mean_abs": (gamma + input_rtol) * mean_abs,
        "zero_fraction": 2 * u,
        "nan_count": 0.0,
        "inf_count": 0.0,
        "size": 0.0,
    }
    for stat in ("min", "max", "abs_max"):
        tolerances[stat] = (2 * u + input_rtol) * magnitude(stat)
    if "weight_l2_norm" in expected:
        tolerances["weight_l2_norm"] = gamma * magnitude("weight_l2_norm")
    return tolerances


def std_bound(mean_error, std, gamma):
    """The two-pass std's error bound (see `stat_tolerances`)."""
    second_order = mean_error**2 / (2 * std) if std > 0 else np.inf
    return min(mean_error, second_order) + gamma * np.hypot(std, mean_error)


def assert_row_matches(series, step_index, variable, expected, input_rtol=0.0):
    """Compares one logged row with `reference_stats` output, NaN where NaN is expected, within
    the rounding bounds of `stat_tolerances` (plus the smallest float32 step, for values of 0).
    A norms-only row (`GradientSeries.full_rows`, format 1.6) holds the every-step stats, the
    others NaN."""
    index = series.variables.index(variable)
    tolerances = stat_tolerances(expected, series.values.dtype, input_rtol)
    full = series.full_rows[step_index]
    for stat, want in expected.items():
        got = series.stat(stat)[step_index, index]
        if not full and stat not in columns.every_step_stats(series.stat_names):
            assert np.isnan(got), f"{variable} {stat} at a norms-only step: got {got}"
        elif np.isnan(want):
            assert np.isnan(got), f"{variable} {stat}: expected NaN, got {got}"
        else:
            tolerance = tolerances[stat] + np.finfo(series.values.dtype).tiny
            assert abs(float(got) - want) <= tolerance, (
                f"{variable} {stat}: got {got!r}, expected {want!r} +- {tolerance:.3g}"
            )


# The files that take longest, longest first (`pytest --durations`, summed per file, on 2
# cores): they run first and the short files fill in behind them, so that `./dev test`'s two
# workers (`--dist loadfile`, a file each at a time) end together rather than one running the
# browser tests alone at the end. xdist would order the files by their number of tests instead
# (its default): ./dev passes --no-loadscope-reorder. test_demo_end_to_end waits for the demo
# that test_browser's worker runs first (see `demo`), so it comes third, not second.
LONGEST_FIRST = (
    "test_browser.py", "test_keras_backends.py", "test_demo_end_to_end.py",
    "test_statistics_precision.py", "test_keras_monitor.py", "test_long_runs_served.py",
    "test_docs.py", "test_torch_sharded.py", "test_readme.py", "test_demo.py",
    "test_route_fuzz.py", "test_transformers_callback.py", "test_torch_monitor.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Runs the files of `LONGEST_FIRST` first, in its order; each file's tests and the other
    files keep their order."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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

    from tensorboard_gradients.server import plugin

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
    """``(logdir, stdout)`` of ``demo/train.py --quick``, run once per test run as a user runs
    it, and read only. Under pytest-xdist once for all workers: the first to ask runs it in the
    run's shared temporary directory while the others wait on a lock (three test files read it,
    on either worker: each worker ran it again, 1.5 minutes of a 2-core machine)."""
    import fcntl

    from support import run_demo

    if "PYTEST_XDIST_WORKER" not in os.environ:
        logdir = tmp_path_factory.mktemp("demo")
        return logdir, run_demo(logdir)
    shared = tmp_path_factory.getbasetemp().parent  # this run's; each worker's is inside it
    logdir, stdout = shared / "demo", shared / "demo.stdout"
    with open(shared / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not stdout.exists():
            stdout.write_text(run_demo(logdir), encoding="utf-8")
    return logdir, stdout.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium driven by Playwright, shared by the browser tests of the session."""
    from playwright.sync_api import sync_playwright

    from support import launch_chromium

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()
