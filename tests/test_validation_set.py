"""The diagnosis on real models (`benchmarks/validation.py`): a healthy Keras network gets no
warning, sick ones (Keras and PyTorch) get their expected findings at the expected variables.

The cases run at their quick sizes through the validation set's own code path (train with the
project's monitor, `read_logdir`, `diagnose`, score); the full set is `python
benchmarks/validation.py`, whose precision and recall are in benchmarks/RESULTS.md.
"""

import sys

import pytest

from support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import validation  # noqa: E402  (benchmarks/validation.py)

pytest.importorskip("tensorflow")

HEALTHY = ("keras_lstm_text",)
SICK = ("keras_disconnected_branch", "keras_deep_sigmoid", "torch_dead_relu", "torch_scaled_loss")


def _messages(alerts):
    return "\n".join(f"{a.severity} {a.kind}/{a.rule}: {a.message}" for a in alerts)


@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_real_model_gets_no_warning(name, tmp_path):
    row = validation.run_case(validation.BY_NAME[name], str(tmp_path), quick=True)
    assert row["steps"] == validation.BY_NAME[name].quick_steps
    assert not row["fp"], "a healthy run was flagged:\n" + _messages(row["fp"])


@pytest.mark.parametrize("name", SICK)
def test_a_sick_real_model_is_flagged_at_the_right_variables(name, tmp_path):
    case = validation.BY_NAME[name]
    row = validation.run_case(case, str(tmp_path), quick=True)
    found = "\n".join(["alerts:", _messages(row["alerts"])])
    assert not row["missed"], ("missed: " + "; ".join(e.describe() for e in row["missed"])
                               + "\n" + found)
    assert not row["fp"], ("alerts no expected finding explains:\n" + _messages(row["fp"])
                           + "\n" + found)


# ----------------------------------------------------------------------------- scoring itself


def _alert(kind, subject, first=1, last=10, severity="warning"):
    from tensorboard_gradients import Alert

    return Alert(kind=kind, rule="rule", variable=subject, layer=None, first_step=first,
                 last_step=last, steps=last - first + 1, value=1.0, threshold=1.0,
                 severity=severity, message=f"{subject}: {kind}")


def test_scoring_matches_kind_subject_and_steps_and_leaves_info_alerts_unscored():
    case = validation.Case(
        "c", "torch", "t", "b", "w", 10,
        expect=(validation.Expect(("exploding", "spike"), r"^fc0\.", steps=(40, None)),
                validation.Expect(("dead",), r"^fc1\."),
                validation.Expect(("vanishing",), r".", required=False)))
    alerts = [
        _alert("spike", "fc0.weight", 38, 45),  # overlaps 40-: TP
        _alert("exploding", "fc0.weight", 1, 39),  # before the range: FP
        _alert("exploding", "fc2.weight", 40, 50),  # another variable: FP
        _alert("vanishing", "fc3.bias"),  # excused by a finding that is not required: TP
        _alert("update_ratio", "fc0.weight", severity="info"),  # unscored
    ]
    row = validation.score(case, alerts)
    assert [a.variable for a in row["tp"]] == ["fc0.weight", "fc3.bias"]
    assert [(a.variable, a.first_step) for a in row["fp"]] == [
        ("fc0.weight", 1), ("fc2.weight", 40)]
    assert [e.subject for e in row["missed"]] == [r"^fc1\."]
    assert row["required"] == 2 and len(row["info"]) == 1
    totals = validation.totals([dict(row, healthy=False)])
    assert (totals["precision"], totals["recall"]) == (0.5, 0.5)


def test_whole_model_and_layer_alerts_are_matched_by_their_subject():
    from tensorboard_gradients import Alert

    expect = validation.Expect(("exploding",), r"^\(model\)$")
    model = Alert(kind="exploding", rule="global", variable=None, layer=None, first_step=1,
                  last_step=2, steps=2, value=1e4, threshold=1e3, severity="critical", message="")
    layer = Alert(kind="vanishing", rule="depth", variable=None, layer="sig_0", first_step=1,
                  last_step=2, steps=2, value=1e-9, threshold=1e-4, severity="warning", message="")
    assert expect.matches(model)
    assert validation.Expect(("vanishing",), r"^sig_0(/|$)").matches(layer)


def test_every_case_names_a_trainer_and_kinds_the_rules_know():
    from tensorboard_gradients.analysis import KINDS

    for case in validation.CASES:
        assert case.framework in ("keras", "torch")
        for expect in case.expect:
            assert set(expect.kinds) <= set(KINDS), (case.name, expect.kinds)
    assert set(validation.QUICK_CASES) <= set(validation.BY_NAME)
