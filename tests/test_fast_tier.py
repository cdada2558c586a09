"""The test tiers. The fast tier (`./dev test --fast`): its list of tests, kept in ./dev, names
tests that exist and run in-process, so the tier stays fast and a renamed file cannot drop out of
it unnoticed. The full suite: the files it runs first (conftest.LONGEST_FIRST) exist."""

import pathlib
import re

import pytest

from conftest import LONGEST_FIRST

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAST_TESTS = re.search(r'^FAST_TESTS="([^"]*)"', (ROOT / "dev").read_text(encoding="utf-8"),
                       re.M).group(1).split()
# What starts a process or a browser in these tests: TensorBoard, Chromium, the demo, ranks.
STARTS_A_PROCESS = re.compile(
    r"\bTensorBoard\(|launch_chromium|run_processes|run_demo|\bsubprocess\b|\bPopen\b"
    r"|def test_\w+\([^)]*\b(browser|demo)\b")


def test_the_fast_tier_covers_analysis_format_statistics_and_routes():
    for concern in ("test_analysis.py", "test_analysis_stream.py", "test_format.py",
                    "test_digest.py", "test_writer_numpy.py", "test_histogram_bins.py",
                    "test_sharded_statistics.py", "test_plugin_routes.py", "test_fast_tier.py"):
        assert f"tests/{concern}" in FAST_TESTS, concern


def test_the_files_run_first_exist():
    assert [name for name in LONGEST_FIRST if not (ROOT / "tests" / name).is_file()] == []


@pytest.mark.parametrize("entry", FAST_TESTS)
def test_each_fast_test_exists_and_starts_no_process(entry):
    path, _, name = entry.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    assert re.fullmatch(r"tests/test_\w+\.py", path), entry
    if name:
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"{entry}: no such test"
        source = re.search(rf"^def {re.escape(name)}\(.*?(?=^\S|\Z)", source, re.M | re.S).group(0)
    if path != "tests/test_fast_tier.py":  # this file names the patterns it looks for
        assert not STARTS_A_PROCESS.search(source), f"{entry} starts a process: not fast-tier"
