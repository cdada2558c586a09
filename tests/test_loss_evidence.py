"""The training loss as evidence: logged beside the gradients by the monitors (or read from the
run's own loss scalar), read back at the gradients' steps, and judged by the loss-spike rule,
whose warnings come before the spike and name the gradient that moved first."""

import math

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format import metadata
from tensorboard_gradients.format.writer import GradientWriter

torch = pytest.importorskip("torch")


def _model_steps(monitor, model, losses, log_loss=True):
    """One backward pass per loss (the monitor's `step` given the loss, or not)."""
    for step, loss in enumerate(losses):
        model.zero_grad()
        output = model(torch.ones(2, 3)).sum()
        output.backward()
        monitor.step(step, loss=torch.tensor(loss, requires_grad=True) if log_loss else None)


def test_the_torch_monitor_logs_the_loss_beside_the_gradients_nan_included(tmp_path):
    from tensorboard_gradients.torch import GradientMonitor

    model = torch.nn.Linear(3, 1)
    losses = [2.0, 1.5, float("nan"), 1.0, float("inf"), 0.5]
    with GradientMonitor(model, str(tmp_path), every_n_steps=2) as monitor:
        _model_steps(monitor, model, losses)
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    # Logged at the steps the gradients are (0, 2, 4), as given: a NaN or Inf loss is kept.
    assert series.steps.tolist() == [0, 2, 4]
    assert series.loss[0] == 2.0 and math.isnan(series.loss[1]) and series.loss[2] == math.inf
    assert series.loss_logged.tolist() == [True, True, True]
    assert series.loss_source == metadata.loss_tag("gradients")


def test_without_a_logged_loss_the_runs_own_loss_scalar_is_read(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from tensorboard_gradients.torch import GradientMonitor

    model = torch.nn.Linear(3, 1)
    with SummaryWriter(str(tmp_path)) as writer, GradientMonitor(model, writer) as monitor:
        for step in range(4):
            model.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            if step != 2:  # a step without the scalar: no loss there
                writer.add_scalar("train/loss", 10.0 - step, step)
            writer.add_scalar("my_loss", 100.0 + step, step)
            monitor.step(step)
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    assert series.loss_source == "train/loss"
    assert series.loss_logged.tolist() == [True, True, False, True]
    assert series.loss[[0, 1, 3]].tolist() == [10.0, 9.0, 7.0] and math.isnan(series.loss[2])
    named = tg.read_logdir(str(tmp_path), loss_scalars=("my_loss",))["."]["gradients"]
    assert named.loss_source == "my_loss" and named.loss.tolist() == [100.0, 101.0, 102.0, 103.0]
    assert tg.read_logdir(str(tmp_path), loss_scalars=())["."]["gradients"].loss is None


def test_a_loss_that_is_not_a_number_is_refused_with_a_clear_error(tmp_path):
    with GradientWriter(str(tmp_path)) as writer:
        with pytest.raises(ValueError, match="loss must be a number or a one-element tensor"):
            writer.write(0, {"w": np.ones(3)}, loss="high")
        with pytest.raises(ValueError, match="loss must be a number"):
            writer.write(0, {"w": np.ones(3)}, loss=np.ones(2))


def _run(tmp_path, losses, norms):
    """A run of two variables whose first one's gradient follows ``norms`` (the other stays at
    1), with ``losses``, written by the numpy writer."""
    with GradientWriter(str(tmp_path)) as writer:
        for step, (loss, norm) in enumerate(zip(losses, norms)):
            writer.write(step, {"encoder/w": np.full(4, norm / 2.0), "head/w": np.full(4, 0.5)},
                         loss=loss)
    return tg.read_logdir(str(tmp_path))["."]["gradients"]


def test_a_loss_climbing_with_the_gradient_is_warned_before_it_spikes(tmp_path):
    rng = np.random.default_rng(0)
    steps = 120
    losses = 1.0 + 0.05 * rng.standard_normal(steps)
    norms = 1.0 + 0.05 * rng.standard_normal(steps)
    # From step 98 the loss climbs, from step 100 with the encoder's gradient (2x a step): 1.1x,
    # 1.2x, 1.3x, 1.7x, 2.5x (the precursor: a fifth rise, past 2x), then 6x and 15x (the spike).
    norms[100:106] *= 2.0 ** np.arange(1, 7)
    losses[98:101] = [1.1, 1.2, 1.3]
    losses[101:105] = [1.7, 2.5, 6.0, 15.0]
    series = _run(tmp_path, losses, norms)
    alerts = [a for a in tg.diagnose(series) if a.kind == "loss_spike"]
    precursor, spike = sorted(alerts, key=lambda a: a.first_step)
    assert (precursor.rule, precursor.severity, precursor.first_step, precursor.raised_step) == (
        "precursor", "warning", 102, 102)
    # A spike is told once it lasted two logged steps.
    assert (spike.rule, spike.severity, spike.first_step, spike.raised_step) == (
        "spike", "warning", 103, 104)
    # The gradient that moved first, and from when.
    assert "encoder/w's gradient moved first" in precursor.message
    assert "from step 100" in precursor.message
    # Its single-step variant on a noisy loss is a hard batch: no finding.
    noisy = _run(tmp_path / "noisy", np.exp(0.4 * rng.standard_normal(steps)) * np.where(
        np.arange(steps) == 90, 8.0, 1.0), 1.0 + 0.05 * rng.standard_normal(steps))
    assert [a for a in tg.diagnose(noisy) if a.kind == "loss_spike"] == []
    # The encoder's gradient spikes alone are context now that the loss is logged.
    assert all(a.severity == "info" for a in tg.diagnose(series) if a.kind == "spike")


def test_a_gradient_raised_with_the_loss_for_four_steps_is_warned_at_the_fourth(tmp_path):
    """A rate past its stable edge: the loss drifts up noisily (never 5 clean rises, never 2x)
    while the gradient stays up, then spikes. Three such steps are a few hard batches."""
    rng = np.random.default_rng(2)
    steps = 120
    losses = 1.0 + 0.02 * rng.standard_normal(steps)
    norms = 1.0 + 0.02 * rng.standard_normal(steps)
    # The global norm is sqrt(encoder^2 + 1), its median about sqrt(2): an encoder norm of 4
    # puts it at 2.9x, of 40 at 28x.
    norms[100:104] = 4.0
    losses[100:104] = [1.4, 1.3, 1.5, 1.35]
    norms[106:110], losses[106:110] = 40.0, 8.0
    series = _run(tmp_path, losses, norms)
    alerts = sorted((a for a in tg.diagnose(series) if a.kind == "loss_spike"),
                    key=lambda a: a.first_step)
    assert [(a.rule, a.first_step, a.raised_step) for a in alerts] == [
        ("sustained", 100, 103), ("spike", 106, 107)]
    assert "for 4 logged steps in a row" in alerts[0].message
    three = losses.copy(), norms.copy()
    three[0][103], three[1][103] = 1.0, 1.0
    three[0][106:110], three[1][106:110] = 1.0, 1.0
    assert [a for a in tg.diagnose(_run(tmp_path / "three", *three))
            if a.kind == "loss_spike"] == []


def test_a_gradient_jump_the_loss_felt_is_warned_and_a_raised_gradient_with_a_falling_loss_not(
        tmp_path):
    rng = np.random.default_rng(3)
    steps = 120
    losses = 1.0 + 0.02 * rng.standard_normal(steps)
    norms = 1.0 + 0.02 * rng.standard_normal(steps)
    norms[100], losses[100] = 30.0, 1.2  # 21x the global norm's median, the loss 1.2x its own
    (jump,) = [a for a in tg.diagnose(_run(tmp_path, losses, norms)) if a.kind == "loss_spike"]
    assert (jump.rule, jump.severity, jump.first_step, jump.raised_step) == (
        "jump", "warning", 100, 100)
    assert "jumped to 21.2x" in jump.message
    # A rate warming up: the gradient 3x up for 20 steps while the loss falls.
    norms[100:120], losses[100:120] = 4.0, np.linspace(0.95, 0.6, 20)
    warming = _run(tmp_path / "warming", losses, norms)
    assert [a for a in tg.diagnose(warming) if a.severity != "info"] == []


def test_a_noisy_loss_and_a_gradient_spike_the_loss_never_felt_raise_no_warning(tmp_path):
    rng = np.random.default_rng(1)
    steps = 200
    losses = np.exp(0.2 * rng.standard_normal(steps))  # mini-batch noise
    norms = np.exp(0.2 * rng.standard_normal(steps))
    norms[150] *= 30  # a rare batch: the gradient jumps, the loss does not
    losses[150] = 1.0  # the noise's median (a loss 1.1x up would be the jump precursor's)
    series = _run(tmp_path, losses, norms)
    assert [a for a in tg.diagnose(series) if a.severity != "info"] == []
    assert any(a.kind == "spike" and a.severity == "info" for a in tg.diagnose(series))


def test_a_loss_that_goes_nan_is_critical(tmp_path):
    losses = [1.0] * 60 + [float("nan")] * 3
    series = _run(tmp_path, losses, [1.0] * 63)
    (spike,) = [a for a in tg.diagnose(series) if a.kind == "loss_spike"]
    assert (spike.severity, spike.first_step, spike.steps) == ("critical", 60, 3)
    assert "loss was not finite" in spike.message


def test_the_cli_judges_a_loss_scalar_it_is_named(tmp_path, capsys):
    import json

    from torch.utils.tensorboard import SummaryWriter

    from tensorboard_gradients import cli

    losses = [1.0] * 60 + [1.1, 1.2, 1.3, 1.7, 2.5, 9.0, 9.0, 1.0]
    with SummaryWriter(str(tmp_path)) as scalars, GradientWriter(str(tmp_path)) as writer:
        for step, loss in enumerate(losses):
            scalars.add_scalar("objective", loss, step)
            writer.write(step, {"w": np.full(4, 3.0 if loss > 2 else 1.0)})

    def loss_findings(*options):
        assert cli.main(["diagnose", str(tmp_path), "--json", "--fail-on", "none", *options]) == 0
        return [(a["rule"], a["first_step"], a["raised_step"])
                for a in json.loads(capsys.readouterr().out)["alerts"] if a["kind"] == "loss_spike"]

    assert loss_findings() == []  # "objective" is no loss scalar it knows
    assert loss_findings("--loss-scalar", "objective") == [("precursor", 64, 64),
                                                           ("spike", 65, 66)]
