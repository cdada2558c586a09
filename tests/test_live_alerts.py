"""Alerts during training: `monitor.alerts()` and ``on_alert`` give a training loop what the
Gradients tab would show, as the run goes, with real PyTorch and Keras training."""

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format.alert_feed import alert_identity
from tensorboard_gradients.format.writer import GradientWriter

JUMP = 70  # the step whose update takes the raised learning rate


def _torch_jump_training(log_dir, on_alert=None, check=None):
    """A 4-layer MLP with Adam, its learning rate raised 30x at `JUMP`; ``check(monitor, step)``
    runs after each step."""
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.torch import GradientMonitor

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=generator)
    y = torch.randint(0, 4, (256,), generator=generator)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with GradientMonitor(model, log_dir, optimizer=optimizer, on_alert=on_alert) as monitor:
        for step in range(JUMP + 15):
            for group in optimizer.param_groups:
                group["lr"] = 1e-3 if step < JUMP else 3e-2
            batch = torch.randint(0, 256, (32,), generator=generator)
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            monitor.step(step, loss=loss)
            optimizer.step()
            if check is not None:
                check(monitor, step)
    return monitor


def test_a_raised_learning_rate_is_told_to_the_loop_the_step_after_it(tmp_path):
    told = {}

    def check(monitor, step):
        if step == JUMP + 1:  # step JUMP is judged once JUMP + 1 is logged
            told["alerts"] = monitor.alerts(wait=True)

    _torch_jump_training(tmp_path, check=check)
    updates = [a for a in told["alerts"] if (a.kind, a.rule) == ("loss_spike", "update")]
    assert len(updates) == 1, told["alerts"]
    assert updates[0].raised_step == JUMP and updates[0].severity == "warning"
    assert "update/weight ratio jumped" in updates[0].message


def test_on_alert_hears_every_alert_the_tab_shows_each_once(tmp_path):
    heard = []
    monitor = _torch_jump_training(tmp_path, on_alert=heard.append)
    shown = tg.diagnose(tg.read_logdir(str(tmp_path))["."]["gradients"])
    assert shown, "the jump raises an alert"
    assert {alert_identity(a) for a in heard} == {alert_identity(a) for a in shown}
    assert len({alert_identity(a) for a in heard}) == len(heard), "each finding once"
    assert monitor.alerts() == heard, "alerts() returns the same, once"
    assert monitor.alerts() == []


def test_what_on_alert_raises_reaches_the_loop_that_wrote(tmp_path):
    class Stop(Exception):
        pass

    stopped = []

    def stop(alert):
        if alert.severity == "critical" and not stopped:
            stopped.append(alert)
            raise Stop(alert.message)

    writer = GradientWriter(tmp_path, on_alert=stop)
    rng = np.random.default_rng(0)
    with pytest.raises(Stop, match="NaN"):
        for step in range(100):
            gradient = rng.normal(size=(8, 8))
            if step >= 40:
                gradient[0, 0] = np.nan  # the model went NaN
            writer.write(step, {"dense.kernel": gradient}, loss=np.nan if step >= 40 else 1.0)
    assert step == 41, "the write after the first NaN step stops the loop"
    writer.close()


def test_a_keras_callback_can_stop_fit_on_a_critical_alert(tmp_path):
    pytest.importorskip("tensorflow")
    import keras

    from tensorboard_gradients.keras import GradientMonitor

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=50.0), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = (100 * x.sum(axis=1, keepdims=True)).astype("float32")

    def stop(alert):
        if alert.severity == "critical":
            model.stop_training = True

    monitor = GradientMonitor(tmp_path, on_alert=stop)
    history = model.fit(x, y, batch_size=8, epochs=30, callbacks=[monitor], verbose=0)
    assert len(history.history["loss"]) < 30, "fit stopped on the critical alert"
    critical = [a for a in monitor.alerts() if a.severity == "critical"]
    assert critical and all(a.raised_step >= 0 for a in critical)


def test_alerts_asked_only_after_close_judge_every_step_written(tmp_path):
    """Nobody asked during the run (the thread only fed the analysis): after close, alerts()
    judges every step, the last one included, as `diagnose` of the run read back does."""
    writer = GradientWriter(tmp_path)
    rng = np.random.default_rng(0)
    for step in range(300):  # more than a chunk of steps fed while nobody asks
        writer.write(step, {"dense.kernel": rng.normal(size=(8, 8))},
                     loss=float("nan") if step == 299 else 1.0)
    writer.close()
    alerts = writer.alerts()
    shown = tg.diagnose(tg.read_logdir(str(tmp_path))["."]["gradients"])
    assert {alert_identity(a) for a in alerts} == {alert_identity(a) for a in shown}
    assert ("loss_spike", "spike", None, None, 299) in {alert_identity(a) for a in alerts}
