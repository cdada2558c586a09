"""The optimizer as evidence: `GradientMonitor(..., optimizer=)` logs each step's real update and
Adam's preconditioned-gradient RMS, checked against copies of the weights taken around real
`torch.optim` steps and against Adam's second moment accumulated here from the gradients."""

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.torch import GradientMonitor  # noqa: E402

OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_l2_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=3e-2, weight_decay=0.1, foreach=True),
    "adamw_maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, maximize=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_decay": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov_maximize": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True),
    "sgd_decay_no_momentum": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.1),
}


def small_model(dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).to(dtype)


def train(model, optimizer, monitor, steps, lr_at=None):
    """Real steps; returns per step each parameter's (gradient, w_after - w_before)."""
    generator = torch.Generator().manual_seed(1)
    seen = []
    for step in range(steps):
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        x = torch.randn(16, 4, generator=generator, dtype=next(model.parameters()).dtype)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        monitor.step(step, loss=loss)
        before = [p.detach().clone() for p in model.parameters()]
        gradients = [p.grad.detach().clone() for p in model.parameters()]
        optimizer.step()
        seen.append([(g, p.detach() - b) for g, p, b in zip(gradients, model.parameters(), before)])
    return seen


def series_of(logdir):
    return tg.read_logdir(str(logdir))["."]["gradients"]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_logged_update_is_the_change_of_the_weights_at_every_step(tmp_path, name):
    model = small_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
        seen = train(model, optimizer, monitor, steps=6)
    series = series_of(tmp_path)
    expected = np.array([[float(delta.norm()) for _, delta in step] for step in seen])
    # float64 weights of size ~0.5 changed by ~1e-3: the copies' difference keeps about
    # 16 - 3 digits, and the rebuilt update is a few roundings of the optimizer's own terms.
    np.testing.assert_allclose(series.stat("update_l2_norm"), expected, rtol=1e-9)
    ratio = series.stat("update_weight_ratio")
    assert np.all(np.isfinite(ratio)) and np.all(ratio > 0)
    assert ("adam_rms" in series.stat_names) == name.startswith("adam")


def test_adam_rms_is_the_gradient_over_the_root_of_adams_bias_corrected_second_moment(tmp_path):
    model = small_model()
    beta2, eps = 0.99, 1e-8
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, beta2), eps=eps)
    with GradientMonitor(model, tmp_path, optimizer=optimizer, stats_every_n_steps=2) as monitor:
        seen = train(model, optimizer, monitor, steps=8)
    moments = [np.zeros(p.shape) for p in model.parameters()]
    expected = []
    for t, step in enumerate(seen, start=1):
        row = []
        for index, (gradient, _) in enumerate(step):
            g = gradient.numpy()
            moments[index] = beta2 * moments[index] + (1 - beta2) * g**2
            corrected = moments[index] / (1 - beta2**t)
            # Without eps (`statistics.adam_rms`): the same whichever framework logged it.
            row.append(np.sqrt(np.mean(g**2 / corrected)))
        expected.append(row)
    # A handful of float64 operations per entry, each well conditioned (no cancellation).
    # Adam's RMS is not a norm: logged at the steps with every statistic (here every 2nd),
    # NaN at the norms-only steps between.
    series = series_of(tmp_path)
    rms, full = series.stat("adam_rms"), series.full_rows
    assert full.tolist() == [i % 2 == 0 for i in range(len(full))] and np.isnan(rms[~full]).all()
    assert not np.isnan(series.stat("update_l2_norm")).any(), "the update is a norm: every step"
    np.testing.assert_allclose(rms[full], np.asarray(expected)[full], rtol=1e-10)
    # v_hat = g^2 at the first step, so each entry is 1; later below 1/sqrt(1 - beta2) = 10.
    np.testing.assert_allclose(expected[0], [1.0] * 4, rtol=1e-12)
    assert np.max(expected) < 10


def test_a_raised_learning_rate_shows_in_the_update_of_its_own_step(tmp_path):
    """What makes a raised rate visible before the loss feels it: the step that takes the new
    rate logs an update 30x the one before."""
    model = small_model(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
        train(model, optimizer, monitor, steps=12, lr_at=lambda s: 1e-3 if s < 10 else 3e-2)
    norms = np.sqrt(np.sum(series_of(tmp_path).stat("update_l2_norm") ** 2, axis=1))
    assert norms[10] / norms[9] == pytest.approx(30, rel=0.3)


def test_a_step_the_optimizer_skipped_is_logged_without_an_update(tmp_path):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
        for step in range(4):
            x = torch.randn(16, 4, generator=generator, dtype=torch.float64)
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            assert monitor.step(step)
            if step != 1:  # a GradScaler skipping a step with Inf gradients does this
                optimizer.step()
        x = torch.randn(16, 4, generator=generator, dtype=torch.float64)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        assert monitor.step(4)  # the monitor closes before this step's update
    series = series_of(tmp_path)
    assert series.steps.tolist() == [0, 1, 2, 3, 4], "no step is dropped"
    missing = np.isnan(series.stat("update_l2_norm")).all(axis=1)
    assert missing.tolist() == [False, True, False, False, True]
    assert np.isfinite(series.stat("l2_norm")).all()


def test_parameters_the_optimizer_does_not_step_have_no_update(tmp_path):
    model = small_model()
    optimizer = torch.optim.Adam(model[0].parameters(), lr=1e-2)
    with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
        train(model, optimizer, monitor, steps=3)
    series = series_of(tmp_path)
    update = series.stat("update_l2_norm")
    assert np.isfinite(update[:, :2]).all() and np.isnan(update[:, 2:]).all()
    assert np.isnan(series.stat("adam_rms")[:, 2:]).all()


def test_an_optimizer_whose_update_is_not_rebuilt_is_said_and_its_gradients_logged(
        tmp_path, caplog):
    model = small_model()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.WARNING):
        with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
            train(model, optimizer, monitor, steps=2)
    assert "updates of RMSprop are not logged" in caplog.text
    series = series_of(tmp_path)
    assert series.steps.tolist() == [0, 1]
    assert "update_l2_norm" not in series.stat_names


def test_the_optimizer_columns_follow_stats(tmp_path):
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with GradientMonitor(model, tmp_path / "a", optimizer=optimizer,
                         stats=("weight_l2_norm", "update_l2_norm")) as monitor:
        train(model, optimizer, monitor, steps=2)
    assert series_of(tmp_path / "a").stat_names[-2:] == ("weight_l2_norm", "update_l2_norm")
    with GradientMonitor(model, tmp_path / "b", optimizer=optimizer, stats=("l2_norm",)) as monitor:
        train(model, optimizer, monitor, steps=2)
    assert "update_l2_norm" not in series_of(tmp_path / "b").stat_names
    with pytest.raises(ValueError, match="torch.optim.Optimizer"):
        GradientMonitor(model, tmp_path / "c", optimizer=object())
