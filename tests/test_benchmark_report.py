"""`benchmarks/run.py --only` reruns some benchmarks into an existing RESULTS.md without losing
the other sections."""

import sys

from support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import run  # noqa: E402  (benchmarks/run.py)

ENV = {"date": "2026-12-02 09:00 UTC", "cpu": "CPU", "cores": 2, "memory_gib": 23.5, "gpu": "none",
       "os": "OS", "load_1min": 0.25, "python": "3.11", "tensorflow": "tf", "keras": "k",
       "torch": "t", "jax": "j", "tensorboard": "tb", "data_server": "ds", "numpy": "np",
       "playwright": "pw", "chromium": "chromium", "plugin": "plugin (git abc1234)"}
REPORT = f"""# Benchmark results

| benchmark | result | took |
| --- | --- | ---: |
| summary_overhead | ok | 3 min |
| keras_overhead | ok | 9 min |

## {run.BENCHMARKS["summary_overhead"]}

old summary body

## {run.BENCHMARKS["keras_overhead"]}

keras body, kept
"""


def _section(name, body):
    return run.Section(name, "ok", "1 min 5 s", False,
                       f"## {run.BENCHMARKS[name]}\n\n`benchmarks/{name}.py`, took 1 min 5 s."
                       f"\n\n{body}")


def test_a_rerun_replaces_its_own_section_and_keeps_the_others():
    report = run.spliced(REPORT, [_section("summary_overhead", "new summary body")], ENV, False)
    assert "old summary body" not in report and "new summary body" in report
    assert report.count(f"## {run.BENCHMARKS['summary_overhead']}") == 1
    assert report.endswith("keras body, kept\n")
    assert "_Rerun alone (full settings)" in report and "- Date: 2026-12-02 09:00 UTC" in report
    assert ("| summary_overhead | ok (rerun alone 2026-12-02 09:00 UTC, see its section) | "
            "1 min 5 s |") in report
    assert "| keras_overhead | ok | 9 min |" in report


def test_a_benchmark_new_to_the_report_is_appended_with_a_row():
    report = run.spliced(REPORT, [_section("long_run", "long body")], ENV, True)
    assert report.index("keras body, kept") < report.index("long body")
    assert "_Rerun alone (quick settings)" in report
    table = report.split("\n\n")[1].splitlines()
    assert table[-1].startswith("| long_run | ok (rerun alone")
    assert run.spliced(report, [_section("long_run", "again")], ENV, True).count("| long_run |") == 1


def test_a_target_counts_every_step_so_a_rare_slow_round_weighs_as_in_training():
    """`_common.target_table`: one round in ten holds a cadence's slow step (a histogram
    step every 100th at 10 steps a round). Its cost is 2% of the total; the median round, which
    leaves that round out, would read 1.00x and call the 1.01x target met."""
    import _common

    rounds = [[1.0, 1.0]] * 90 + [[1.2, 1.0]] * 10
    row = {"batch": 256, "pairs": {"ours/none": rounds}}
    cells = _common.target_table([row], [("ours", "none", 1.01, "defaults")]).splitlines()[-1]
    assert [c.strip() for c in cells.strip("|").split("|")] == [
        "256", "defaults", "1.020x", "1.010-1.030", "1.000x", "1.00-1.20", "1.020", "<= 1.01x",
        "no"]
    reference = _common.target_table([row], [("ours", "none", None, "beside")]).splitlines()[-1]
    assert [c.strip() for c in reference.strip("|").split("|")][-2:] == ["-", "-"]
    # Rounds from two processes: each one's ratio of totals beside the pooled one.
    two = _common.target_table([dict(row, processes=2)], [("ours", "none", 1.01, "defaults")])
    cells = [c.strip() for c in two.splitlines()[-1].strip("|").split("|")]
    assert cells[6] == "1.000, 1.040"
    low, high = map(float, cells[3].split("-"))  # the processes resampled: 1.00 to 1.04 apart
    assert low < 1.005 and high > 1.035
