"""`tensorboard_gradients.jax.gradient_monitor`: the optax transformation, in real Flax training
(``nnx.Optimizer`` under ``nnx.jit``, a linen ``TrainState``) and plain optax loops, on CPU."""

import json
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
tensorboardX = pytest.importorskip("tensorboardX")
import jax.numpy as jnp  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.format import columns  # noqa: E402
from tensorboard_gradients.jax import (  # noqa: E402
    GradientMonitorState, clip_by_global_norm, gradient_monitor, log_gradients)

from conftest import (  # noqa: E402
    assert_row_matches, reference_histogram, reference_stats, stat_tolerances)

ROWS = ("linear1/bias", "linear1/kernel", "linear2/bias", "linear2/kernel")
# How far the monitored gradient entries may be from the reference's (`assert_row_matches`'s
# input_rtol; the statistics' own rounding is bounded there). The reference evaluates the same
# formulas eagerly, op by op, the monitor sees those of the compiled train step: XLA rounds the
# 32-term batch sums of a kernel gradient in another order, up to 32 u ~ 2e-6 of the summed
# magnitudes (u = 2**-24; cancellation within a sum can make that a few times more of the
# result). Measured: up to ~5e-7 (with 0 the test fails: the entries are not bit-identical).
INPUT_RTOL = 1e-5


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(6, 16, rngs=rngs)
        self.linear2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jnp.tanh(self.linear1(x)))


def mse(prediction, y):
    return jnp.mean((prediction - y) ** 2)


def reference_gradients(params, x, y):
    """``{row: (gradient, weight)}`` by `jax.grad` of the MLP written out in `jnp`, on numpy
    copies of the parameters: no optimizer, no Flax, no monitor."""
    def loss(p):
        hidden = jnp.tanh(x @ p["linear1"]["kernel"] + p["linear1"]["bias"])
        return mse(hidden @ p["linear2"]["kernel"] + p["linear2"]["bias"], y)

    grads = jax.grad(loss)(params)
    return {f"{layer}/{leaf}": (np.asarray(grads[layer][leaf]), params[layer][leaf])
            for layer in params for leaf in params[layer]}


def snapshot(model):
    return {layer: {leaf: np.array(getattr(getattr(model, layer), leaf)[...])
                    for leaf in ("kernel", "bias")} for layer in ("linear1", "linear2")}


def batches(count, seed=0):
    rng = np.random.default_rng(seed)
    return [(jnp.asarray(rng.normal(size=(32, 6)), jnp.float32),
             jnp.asarray(rng.normal(size=(32, 3)), jnp.float32)) for _ in range(count)]


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
    optimizer.update(model, grads)
    return loss


def loss_steps(run_dir):
    return [e.step for e in event_accumulator.EventAccumulator(
        str(run_dir)).Reload().Scalars("loss")]


def series_of(logdir, run="."):
    return tg.read_logdir(str(logdir))[run]["gradients"]


def test_nnx_training_logs_the_gradients_of_each_update_at_its_loss_step(tmp_path,
                                                                         plugin_client):
    run = tmp_path / "nnx"
    model = MLP(nnx.Rngs(0))
    tx = optax.chain(gradient_monitor(str(run), histograms_every_n_steps=2,
                                      stats_every_n_steps=2), optax.adam(1e-2))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    losses = tensorboardX.SummaryWriter(str(run))
    seen = []
    for step, (x, y) in enumerate(batches(5)):
        assert int(optimizer.step[...]) == step  # Flax's count before the update: the same rule
        seen.append(reference_gradients(snapshot(model), x, y))
        losses.add_scalar("loss", float(train_step(model, optimizer, x, y)), step)
    losses.close()
    jax.effects_barrier()  # the writes happen in callbacks of the compiled steps

    series = series_of(run)
    assert series.variables == ROWS and series.layers == ("linear1",) * 2 + ("linear2",) * 2
    assert series.shapes == ((16,), (6, 16), (3,), (16, 3))
    assert series.steps.tolist() == loss_steps(run) == [0, 1, 2, 3, 4]
    # Every statistic at every 2nd logged step, the norms between (one pass inside the step).
    assert series.full_rows.tolist() == [True, False, True, False, True]
    assert series.stats_every == 2
    for index, rows in enumerate(seen):
        for name, (gradient, weight) in rows.items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight),
                               input_rtol=INPUT_RTOL)
    assert series.histograms.steps.tolist() == [0, 2, 4]
    kernel = ROWS.index("linear1/kernel")
    np.testing.assert_array_equal(series.histograms.counts[1, kernel],
                                  reference_histogram(seen[2]["linear1/kernel"][0]))

    state = optimizer.opt_state[0]  # the last logged step's matrix, in the optimizer state
    assert isinstance(state, GradientMonitorState) and state.variables == ROWS
    assert (int(state.count[...]), int(state.step[...])) == (5, 4)
    np.testing.assert_array_equal(np.asarray(state.stats[...]), series.values[-1])

    client = plugin_client(str(tmp_path))
    runs = json.loads(client.get("/data/plugin/gradients/runs").get_data())
    assert runs["nnx"]["gradients"]["variables"] == 4 and runs["nnx"]["gradients"]["steps"] == 5
    assert runs["nnx"]["gradients"]["histograms"] is True
    heatmap = json.loads(client.get(
        "/data/plugin/gradients/heatmap?run=nnx&tag=gradients&stat=l2_norm").get_data())
    assert heatmap["steps"] == [0, 1, 2, 3, 4] and heatmap["variables"] == list(ROWS)
    np.testing.assert_allclose(heatmap["values"], series.stat("l2_norm").T, rtol=1e-6)


def test_schedules_log_multiples_of_n_and_skipped_steps_keep_the_last_matrix(tmp_path):
    model = MLP(nnx.Rngs(1))
    tx = optax.chain(gradient_monitor(str(tmp_path), every_n_steps=3, histograms_every_n_steps=2),
                     optax.sgd(0.1))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    norms = []
    for x, y in batches(8, seed=1):
        train_step(model, optimizer, x, y)
        norms.append(np.asarray(optimizer.opt_state[0].stat("l2_norm")[...]))
    jax.effects_barrier()
    series = series_of(tmp_path)
    assert series.steps.tolist() == [0, 3, 6]
    assert series.histograms.steps.tolist() == [0, 2, 4, 6]  # 2 and 4: histograms alone
    for step, norm in enumerate(norms):  # the state holds the last logged step's statistics
        np.testing.assert_array_equal(norm, series.stat("l2_norm")[step // 3])
    assert int(optimizer.opt_state[0].step[...]) == 6


def test_the_steps_of_skipped_updates_compute_no_statistics():
    params = {"linear1": {"kernel": jnp.ones((64, 64)), "bias": jnp.zeros(64)}}
    tx = gradient_monitor(None, every_n_steps=10)
    state = tx.init(params)
    jaxpr = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(params, state, params).jaxpr
    outside = {eqn.primitive.name for eqn in jaxpr.eqns}
    conds = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "cond"]
    assert len(conds) == 1 and not any(
        name.startswith(("reduce", "dot", "sqrt", "abs")) for name in outside), outside
    skipped, logged = (branch.jaxpr for branch in conds[0].params["branches"])
    assert skipped.eqns == [] and "reduce_max" in primitives(logged)


def primitives(jaxpr):
    """The primitives of ``jaxpr`` and of the jaxprs inside it (jit, cond, ...)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                if hasattr(inner, "eqns") or hasattr(getattr(inner, "jaxpr", None), "eqns"):
                    names |= primitives(getattr(inner, "jaxpr", inner))
    return names


def test_explicit_steps_through_optax_extra_args_in_a_plain_loop_and_nnx(tmp_path):
    params = {"Dense_0": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
    grads = jax.tree_util.tree_map(lambda p: 0.5 * p + 0.25, params)
    tx = optax.chain(gradient_monitor(str(tmp_path / "plain"), every_n_steps=2), optax.sgd(0.1))
    state = tx.init(params)
    update = jax.jit(lambda g, s, p, step: tx.update(g, s, p, step=step))
    for step in range(101, 106):  # 1-based, resumed: the multiples of 2 are logged
        updates, state = update(grads, state, params, step)
        params = optax.apply_updates(params, updates)
    jax.effects_barrier()
    assert series_of(tmp_path / "plain").steps.tolist() == [102, 104]
    assert int(optax.tree.get(state, "step")) == 104  # found by name, wherever in the chain
    assert optax.tree.get(state, "stats").shape == (2, len(columns.stats_for(True, False)))

    model = MLP(nnx.Rngs(2))
    writer = tg.GradientWriter(str(tmp_path / "nnx"))
    optimizer = nnx.Optimizer(model, optax.chain(gradient_monitor(writer), optax.adam(1e-3)),
                              wrt=nnx.Param)

    @nnx.jit
    def step_at(model, optimizer, x, y, step):
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads, step=step)
        return loss

    for step, (x, y) in enumerate(batches(3), start=1):
        writer.write_scalars(step, {"loss": step_at(model, optimizer, x, y, step)})
    jax.effects_barrier()
    writer.close()
    assert series_of(tmp_path / "nnx").steps.tolist() == [1, 2, 3]
    assert [e.step for e in event_accumulator.EventAccumulator(str(tmp_path / "nnx")).Reload(
        ).Tensors("gradients/loss")] == [1, 2, 3]


def test_inside_multisteps_each_optimizer_step_logs_its_accumulated_gradient(tmp_path):
    params = {"w": jnp.zeros(3)}
    tx = optax.MultiSteps(optax.chain(gradient_monitor(str(tmp_path), stats_every_n_steps=1),
                                      optax.sgd(0.1)), every_k_schedule=2)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for micro_batch in range(6):
        _, state = update({"w": jnp.full(3, float(micro_batch))}, state, params)
    jax.effects_barrier()
    series = series_of(tmp_path)
    assert series.steps.tolist() == [0, 1, 2]  # optimizer steps, not micro-batches
    np.testing.assert_array_equal(series.stat("mean")[:, 0], [0.5, 2.5, 4.5])


def test_linen_train_state_logs_at_its_step(tmp_path):
    linen = pytest.importorskip("flax.linen")
    train_state = pytest.importorskip("flax.training.train_state")

    class Net(linen.Module):
        @linen.compact
        def __call__(self, x):
            return linen.Dense(3, name="linear2")(jnp.tanh(linen.Dense(16, name="linear1")(x)))

    data = batches(3, seed=3)
    net = Net()
    params = net.init(jax.random.PRNGKey(0), data[0][0])["params"]
    state = train_state.TrainState.create(
        apply_fn=net.apply, params=params,
        tx=optax.chain(gradient_monitor(str(tmp_path)), optax.sgd(0.05)))

    @jax.jit
    def step_fn(state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: mse(state.apply_fn({"params": p}, x), y))(state.params)
        return state.apply_gradients(grads=grads), loss

    losses = tensorboardX.SummaryWriter(str(tmp_path))
    seen = []
    for x, y in data:
        seen.append(reference_gradients(jax.tree_util.tree_map(np.asarray, state.params), x, y))
        step = int(state.step)  # TrainState.step before the update
        state, loss = step_fn(state, x, y)
        losses.add_scalar("loss", float(loss), step)
    losses.close()
    jax.effects_barrier()
    series = series_of(tmp_path)
    assert series.variables == ROWS and series.steps.tolist() == loss_steps(tmp_path) == [0, 1, 2]
    for index, rows in enumerate(seen):
        for name, (gradient, weight) in rows.items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight),
                               input_rtol=INPUT_RTOL)


def test_state_only_mode_exposes_the_matrix_inside_jit_and_writes_nothing(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = MLP(nnx.Rngs(4))
    optimizer = nnx.Optimizer(
        model, optax.chain(gradient_monitor(None, exclude=r"/bias$"), optax.sgd(0.1)),
        wrt=nnx.Param)

    @nnx.jit
    def step_with_norms(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads)
        state = optimizer.opt_state[0]
        return state.stat("l2_norm"), state.stats

    (x, y), = batches(1, seed=4)
    expected = reference_gradients(snapshot(model), x, y)
    norms, stats = step_with_norms(model, optimizer, x, y)
    jax.effects_barrier()
    assert os.listdir(tmp_path) == []
    state = optimizer.opt_state[0]
    assert state.variables == ("linear1/kernel", "linear2/kernel")
    assert state.columns == columns.stats_for(with_weights=True, with_updates=False)
    np.testing.assert_array_equal(norms, stats[:, state.columns.index("l2_norm")])
    for row, name in enumerate(state.variables):
        want = reference_stats(*expected[name])
        tolerances = stat_tolerances(want, np.float32, INPUT_RTOL)
        for stat, value in want.items():
            got = float(stats[row, state.columns.index(stat)])
            assert abs(got - value) <= tolerances[stat] + np.finfo(np.float32).tiny, (name, stat)


def test_without_params_the_weight_columns_are_left_out(tmp_path):
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    tx = gradient_monitor(str(tmp_path))
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones((2, 3))}, state)  # eagerly, without params
    jax.effects_barrier()
    series = series_of(tmp_path)
    assert series.stat_names == columns.stats_for(with_weights=False, with_updates=False)
    assert_row_matches(series, 0, "w", reference_stats(np.ones((2, 3))))
    assert np.isnan(state.stat("weight_l2_norm")).all()
    assert float(state.stat("l2_norm")[0]) == pytest.approx(np.sqrt(6))


def test_nnx_variables_are_named_by_their_path(tmp_path):
    model = MLP(nnx.Rngs(5))
    grads = nnx.grad(lambda m: mse(m(jnp.ones((2, 6))), 0.0))(model)  # Param leaves, not arrays
    with tg.GradientWriter(str(tmp_path)) as writer:
        log_gradients(writer, grads, 0, params=nnx.state(model, nnx.Param))
    assert series_of(tmp_path).variables == ROWS


def test_bad_arguments_are_clear_errors(tmp_path):
    for kwargs, message in (
            ({"every_n_steps": 0}, "every_n_steps must be a positive integer"),
            ({"histograms_every_n_steps": 1.5}, "histograms_every_n_steps must be a positive"),
            ({"name": ""}, "name must be a non-empty string"),
            ({"include": "("}, "include must be regular expressions"),
    ):
        with pytest.raises(ValueError, match=message):
            gradient_monitor(str(tmp_path), **kwargs)
    with pytest.raises(ValueError, match="log_dir"):
        gradient_monitor(42)
    with pytest.raises(ValueError, match="histograms_every_n_steps needs a log_dir"):
        gradient_monitor(None, histograms_every_n_steps=10)
    with pytest.raises(ValueError, match="pass them to GradientWriter"):
        gradient_monitor(tg.GradientWriter(str(tmp_path)), name="other")
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="no leaf to watch"):
        gradient_monitor(None, include="nothing").init(params)
    tx = gradient_monitor(None)
    state = tx.init(params)
    with pytest.raises(ValueError, match="initialised with leaves"):
        tx.update({"v": jnp.ones(3)}, state)
    with pytest.raises(ValueError, match="step must be an integer scalar"):
        tx.update(params, state, step=1.5)
    with pytest.raises(ValueError, match="params has no leaves"):
        tx.update(params, state, {"v": jnp.ones(3)})


def test_the_loss_is_logged_beside_the_gradients_through_optax_value_and_log_gradients(tmp_path):
    """optax's ``value=`` extra argument (the loss, as ``reduce_on_plateau`` takes it) inside
    ``nnx.jit``, and `log_gradients(loss=)` inside and outside ``jit``: each logged step's loss
    is the one computed there."""
    model = MLP(nnx.Rngs(3))
    optimizer = nnx.Optimizer(model, optax.chain(
        gradient_monitor(str(tmp_path / "optax"), every_n_steps=2), optax.adam(1e-3)),
        wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(lambda m: mse(m(x), y))(model)
        optimizer.update(model, grads, value=loss)
        return loss

    losses = [float(train_step(model, optimizer, x, y)) for x, y in batches(4)]
    jax.effects_barrier()
    series = series_of(tmp_path / "optax")
    assert series.steps.tolist() == [0, 2] and series.loss_logged.all()
    # float32 losses, read back exactly: the same number the step returned.
    assert series.loss.tolist() == [losses[0], losses[2]]

    params = {"dense": {"kernel": jnp.ones((3, 2))}}
    with tg.GradientWriter(str(tmp_path / "plain")) as writer:
        jitted = jax.jit(lambda g, step, loss: log_gradients(writer, g, step, loss=loss))
        jitted(params, 0, jnp.float32(2.5))
        jax.effects_barrier()
        log_gradients(writer, params, 1, loss=float("nan"))
    series = series_of(tmp_path / "plain")
    assert series.loss[0] == 2.5 and np.isnan(series.loss[1]) and series.loss_logged.all()


def test_wrapping_the_optimizer_logs_each_steps_real_update(tmp_path):
    """Given the optimizer, the monitor runs it and logs the updates it returns, the change
    `optax.apply_updates` makes to the parameters; a learning rate raised 30x shows at the step
    that takes it (through `optax.inject_hyperparams`, and under nnx.jit)."""
    model = MLP(nnx.Rngs(0))
    adam = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)
    writer = tg.GradientWriter(str(tmp_path))
    tx = gradient_monitor(writer, optimizer=adam, stats_every_n_steps=2)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    changes = []
    for step, (x, y) in enumerate(batches(8)):
        if step == 6:
            optimizer.opt_state.inner.hyperparams["learning_rate"][...] = 3e-2
        before = snapshot(model)
        train_step(model, optimizer, x, y)
        after = snapshot(model)
        changes.append([np.linalg.norm(after[layer][leaf].astype(np.float64)
                                       - before[layer][leaf].astype(np.float64))
                        for layer, leaf in (row.split("/") for row in ROWS)])
    jax.effects_barrier()
    writer.close()
    series = series_of(tmp_path)
    assert series.variables == ROWS
    assert series.stat_names[-3:] == ("weight_l2_norm", "update_l2_norm", "adam_rms")
    # The float32 parameters' difference keeps the update to |w| / |update| ~ 1e3 roundings of
    # float32 (u = 6e-8): 1e-4 of the update, with room.
    np.testing.assert_allclose(series.stat("update_l2_norm"), changes, rtol=5e-4)
    norms = np.linalg.norm(series.stat("update_l2_norm"), axis=1)
    assert norms[6] / norms[5] == pytest.approx(30, rel=0.3)
    ratio = series.stat("update_weight_ratio")  # biases start at 0: no ratio at step 0
    assert np.isfinite(ratio[:, [1, 3]]).all() and np.isfinite(ratio[1:]).all()
    # Adam's beta2 read through inject_hyperparams' state: v_hat = g^2 at the first step (no
    # cancellation: v was 0), each entry's ratio 1; then within 1 / sqrt(1 - 0.999) = 31.6. Not
    # a norm: logged at the steps with every statistic (every 2nd), NaN at the norms-only ones,
    # where the update's norm is logged all the same (above).
    rms = series.stat("adam_rms")
    np.testing.assert_allclose(rms[0], 1, rtol=1e-6)
    assert np.all((rms[::2] > 0) & (rms[::2] < 31.7)) and np.isnan(rms[1::2]).all()


def test_adam_rms_is_read_from_the_wrapped_optimizers_state(tmp_path):
    """The RMS of g / sqrt(v_hat) with g the gradient Adam received, here clipped by the chain
    before it, against Adam replayed in float64 from reference gradients; beta2 read from the
    optimizer. An optimizer without Adam logs no such column."""
    beta2, clip = 0.99, 0.1
    params = {layer: {leaf: np.asarray(value) for leaf, value in leaves.items()}
              for layer, leaves in snapshot(MLP(nnx.Rngs(0))).items()}
    tx = gradient_monitor(str(tmp_path / "adam"), optimizer=optax.chain(
        optax.clip_by_global_norm(clip), optax.adamw(1e-2, b2=beta2)), stats_every_n_steps=1)
    sgd = gradient_monitor(str(tmp_path / "sgd"), optimizer=optax.sgd(1e-2))
    state, sgd_state = tx.init(params), sgd.init(params)
    update = jax.jit(tx.update)
    seconds, expected = None, []
    for t, (x, y) in enumerate(batches(8), start=1):
        reference = reference_gradients(params, np.asarray(x, np.float64), np.asarray(y, np.float64))
        grads = {layer: {leaf: reference[f"{layer}/{leaf}"][0].astype(np.float32)
                         for leaf in params[layer]} for layer in params}
        norm = np.sqrt(sum(np.sum(reference[row][0] ** 2) for row in ROWS))
        received = [reference[row][0] * min(1.0, clip / norm) for row in ROWS]
        seconds = [beta2 * (0 if seconds is None else s) + (1 - beta2) * g**2
                   for s, g in zip(seconds or received, received)]
        expected.append([np.sqrt(np.mean(g**2 * (1 - beta2**t) / v))
                         for g, v in zip(received, seconds)])
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        _, sgd_state = sgd.update(grads, sgd_state, params)
    jax.effects_barrier()
    assert norm > 3 * clip, "the clipping bit"
    # Each entry's g^2 comes back from v's update, (v_new - beta2 v_old) / (1 - beta2): an
    # absolute error of ~u / (1 - beta2) = 6e-6 per ratio (u = 6e-8, float32), beside the float32
    # gradients' ~1e-6 relative difference from the float64 reference.
    np.testing.assert_allclose(series_of(tmp_path, "adam").stat("adam_rms"), expected, rtol=1e-4)
    assert "adam_rms" not in series_of(tmp_path, "sgd").stat_names


def _tensors(run_dir, tag):
    from tensorboard.util import tensor_util

    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in event_accumulator.EventAccumulator(str(run_dir)).Reload().Tensors(tag)}


def test_clip_by_global_norm_clips_as_optax_does_and_logs_the_gradients_before_it(tmp_path):
    """Under nnx.jit, beside a model trained with optax's own clip: the same parameters at every
    step, the logged statistics those of the gradients before clipping, and the global norm and
    coefficient of each step."""
    model, reference = MLP(nnx.Rngs(0)), MLP(nnx.Rngs(0))
    writer = tg.GradientWriter(str(tmp_path))
    # Only the kernels are logged; the whole tree is clipped.
    tx = optax.chain(clip_by_global_norm(0.05, writer, exclude="/bias$"), optax.sgd(0.1))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    reference_optimizer = nnx.Optimizer(
        reference, optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.1)), wrt=nnx.Param)
    seen = []
    for x, y in batches(4):
        seen.append(reference_gradients(snapshot(reference), x, y))
        train_step(model, optimizer, x, y)
        train_step(reference, reference_optimizer, x, y)
        # optax's function on the same gradients in one compiled step: bit for bit.
        for layer in ("linear1", "linear2"):
            for leaf in ("kernel", "bias"):
                np.testing.assert_array_equal(snapshot(model)[layer][leaf],
                                              snapshot(reference)[layer][leaf])
    jax.effects_barrier()
    writer.close()
    series = series_of(tmp_path)
    assert series.variables == ("linear1/kernel", "linear2/kernel")
    for index, gradients in enumerate(seen):
        for name in series.variables:
            gradient, _ = gradients[name]
            assert_row_matches(series, index, name, reference_stats(gradient),
                               input_rtol=INPUT_RTOL)
    totals = _tensors(tmp_path, "gradients/global_norm_before_clipping")
    coefficients = _tensors(tmp_path, "gradients/clip_coefficient")
    assert sorted(totals) == sorted(coefficients) == [0, 1, 2, 3]
    for step, gradients in enumerate(seen):
        whole = np.concatenate([g.ravel() for g, _ in gradients.values()]).astype(np.float64)
        # The compiled step's float32 gradients against the eager reference's (INPUT_RTOL).
        assert totals[step] == pytest.approx(np.linalg.norm(whole), rel=INPUT_RTOL)
        assert coefficients[step] == pytest.approx(min(1.0, 0.05 / totals[step]), rel=1e-6)
    assert max(coefficients.values()) < 1, "these gradients were clipped"


def test_clip_by_global_norm_wraps_the_optimizer_and_refuses_a_bad_threshold(tmp_path):
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    grads = {"w": jnp.full((3, 2), 2.0), "b": jnp.ones(2)}
    tx = clip_by_global_norm(1.0, None, optimizer=optax.sgd(1.0))
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    expected, _ = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0)).update(
        grads, optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0)).init(params))
    for key in params:
        np.testing.assert_array_equal(updates[key], expected[key])
    # The update logged is the optimizer's (clipped, times -1), the gradient the one given.
    assert state.stat("l2_norm")[state.variables.index("w")] == pytest.approx(np.sqrt(24))
    np.testing.assert_allclose(np.linalg.norm(state.stat("update_l2_norm")), 1.0, rtol=1e-6)
    for bad in (0, -1.0, float("nan"), "1", None):
        with pytest.raises(ValueError, match="max_norm must be a positive number"):
            clip_by_global_norm(bad)
