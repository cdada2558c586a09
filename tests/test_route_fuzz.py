"""A bounded, seeded fuzz of every route against a real `tensorboard` per loader: never a 500.

Valid requests for every route (on the healthy run and on the damaged runs of
`test_server_robustness`) are changed one parameter at a time to hostile values (huge, negative
and overflowing integers, floats, NaN/Inf, empty, unicode, very long strings, path tricks), a
parameter is dropped, repeated or an unknown one added, and seeded random combinations follow.
Every answer must be below 500; the failures are collected and reported together. A few
thousand probes per loader over keep-alive connections, a few workers, a timeout on every call.
"""

import concurrent.futures
import http.client
import random
import threading
import urllib.parse

import pytest

from support import TensorBoard
from test_server_robustness import TAG, expected_steps, write_logdir

SEED = 20260101
RANDOM_PROBES = 600
WORKERS = 4
TIMEOUT_S = 30
THRESHOLDS = ("exploding_norm", "spike_window", "sustain_steps", "update_ratio_low",
              "depth_reference_fraction")
INTEGERS = ["0", "1", "-1", "2", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "-9223372036854775809", "18446744073709551616",
            "9" * 4300, "9" * 5000, "1_000", "+5", " 7 ", "0x10", "1e3", "٣", "１２"]
FLOATS = ["0.5", "1e-320", "5e-324", "1e308", "1e309", "-1e309", "nan", "NaN", "-nan", "inf",
          "-inf", "Infinity", "-0", "1e-400", "0.0"]
TEXTS = ["", " ", "%", "%zz", "\x00", "\ud800", "ü", "\u202e", "<script>alert(1)</script>",
         "../../etc/passwd", "..", ".", "/", "\\", "a" * 70000, "a" * 2000, "true", "[]", "{}",
         "null", "l2_norm\x00", "gradients_histograms", "gradients_epochs", "😀" * 100]
HOSTILE = INTEGERS + FLOATS + TEXTS
RUNS = ["good", "bomb", "checksum", "string_tensor", "histograms_fewer_variables",
        "unreadable_record", "version_overflow", "deep_nesting"]
PATH_PROBES = [
    "static/../cli.py", "static/%2e%2e/cli.py", "static/..%2f..%2fetc/passwd",
    "static/%00", "static/index.js%00.png", "static/" + "a" * 5000, "static/.", "static/..",
    "static//etc/passwd", "static/%c0%ae%c0%ae/cli.py", "runs/", "heatmap/x", "static",
    "nope", "%ff", "runs%00", "static/index.js?" + "x=1&" * 500,
]


def base_requests(run, variable):
    """Valid requests (route, [(name, value), ...]) for every route on one run."""
    common = [("run", run), ("tag", TAG)]
    return [
        ("runs", []),
        ("thresholds", []),
        ("inventory", []),
        ("heatmap", common + [("stat", "l2_norm")]),
        ("heatmap", common + [("stat", "l2_norm"), ("max_steps", "7"), ("encoding", "base64"),
                              ("first_step", "2"), ("last_step", "20"), ("exploding_norm", "10")]),
        ("heatmap", common + [("stat", "nan_count"), ("axis", "epoch")]),
        ("alerts", common + [("sustain_steps", "2")]),
        ("series", common + [("variable_index", "1")]),
        ("series", common + [("variable", variable), ("spike_window", "3")]),
        ("histogram", common + [("variable_index", "0"), ("step", "12")]),
        ("histogram", common + [("variable", variable), ("step", "1")]),
        ("export", common + [("format", "csv")]),
        ("static/index.js", []),
    ]


def one_parameter_changed(rng):
    """Each base request with one parameter replaced, dropped, repeated; unknown ones added."""
    probes = []
    damaged = base_requests(rng.choice(RUNS[1:]), "a/kernel")
    for route, params in base_requests("good", "fc1/weight") + damaged:
        probes.append((route, params))
        for i, (name, _) in enumerate(params):
            for value in HOSTILE:
                probes.append((route, params[:i] + [(name, value)] + params[i + 1:]))
            probes.append((route, params[:i] + params[i + 1:]))
            probes.append((route, params + [params[i]]))
        for name in ("bogus", "", "variable_index", "max_steps", "step", "first_step"):
            probes.append((route, params + [(name, rng.choice(HOSTILE))]))
        if route in ("heatmap", "alerts", "series"):
            for name in THRESHOLDS:
                for value in INTEGERS[:9] + FLOATS:
                    probes.append((route, params + [(name, value)]))
    return probes


def random_probes(rng, count):
    names = ["run", "tag", "stat", "max_steps", "axis", "encoding", "first_step", "last_step",
             "variable", "variable_index", "step", "format", *THRESHOLDS]
    routes = ["runs", "heatmap", "alerts", "series", "histogram", "export", "thresholds",
              "inventory"]
    probes = []
    for _ in range(count):
        params = [("run", rng.choice(RUNS)), ("tag", TAG)]
        for name in rng.sample(names, rng.randint(0, 5)):
            params.append((name, rng.choice(HOSTILE + ["l2_norm", "epoch", "base64", "csv", "3"])))
        rng.shuffle(params)
        probes.append((rng.choice(routes), params))
    return probes


def url_of(route, params):
    return "/data/plugin/gradients/" + route + (
        "?" + urllib.parse.urlencode(params, errors="surrogatepass") if params else "")


class _Connections(threading.local):
    connection = None


def run_probes(port, paths):
    """``[(path, status or error)]`` of every probe answered >= 500 or not answered at all."""
    connections = _Connections()

    def probe(path):
        for attempt in range(2):  # a kept-alive connection the server closed: reconnect once
            if connections.connection is None:
                connections.connection = http.client.HTTPConnection(
                    "127.0.0.1", port, timeout=TIMEOUT_S)
            try:
                connections.connection.request("GET", path, headers={"Accept-Encoding": "gzip"})
                response = connections.connection.getresponse()
                response.read()
                if response.will_close:
                    connections.connection.close()
                    connections.connection = None
                return None if response.status < 500 else (path, response.status)
            except (OSError, http.client.HTTPException) as error:
                connections.connection.close()
                connections.connection = None
                if attempt:
                    return path, f"{type(error).__name__}: {error}"
        return None

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return [failure for failure in pool.map(probe, paths) if failure]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return write_logdir(tmp_path_factory.mktemp("fuzzed"))


@pytest.mark.parametrize("load_fast", ["true", "false"], ids=["rust", "python"])
def test_no_probe_answers_a_server_error(logdir, load_fast):
    rng = random.Random(SEED)
    probes = one_parameter_changed(rng) + random_probes(rng, RANDOM_PROBES)
    paths = [url_of(route, params) for route, params in probes]
    paths += ["/data/plugin/gradients/" + path for path in PATH_PROBES]
    assert len(paths) > 3000
    expected = expected_steps(load_fast)
    with TensorBoard(logdir, load_fast=load_fast) as tensorboard:
        tensorboard.wait_for(
            lambda: {run: tags.get(TAG, {}).get("steps")
                     for run, tags in (tensorboard.runs() or {}).items()} == expected,
            "every run to be loaded")
        port = int(tensorboard.base.rsplit(":", 1)[1])
        failures = run_probes(port, paths)
        assert tensorboard.runs() is not None, "TensorBoard still answers after the fuzz"
    report = "\n".join(f"{status}: {path[:300]}" for path, status in failures[:40])
    assert not failures, f"{len(failures)} of {len(paths)} probes failed:\n{report}"
