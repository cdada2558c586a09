"""`tensorboard_gradients.torch.GradientMonitor` in real PyTorch training loops on CPU."""

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.format import columns  # noqa: E402
from tensorboard_gradients.torch import GradientMonitor  # noqa: E402

from conftest import assert_row_matches, norm_rtol, reference_histogram, reference_stats  # noqa: E402


def sigmoid_mlp(depth=10, width=32, features=16, classes=4):
    layers = [torch.nn.Linear(features, width), torch.nn.Sigmoid()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.Sigmoid()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def batches(count, size=64, features=16, classes=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, features, generator=generator),
             torch.randint(0, classes, (size,), generator=generator)) for _ in range(count)]


def series_of(logdir, run="."):
    return tg.read_logdir(str(logdir))[run]["gradients"]


def test_statistics_match_an_independent_reference_at_every_logged_step(tmp_path):
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = []
    with GradientMonitor(model, tmp_path, histograms_every_n_steps=2) as monitor:
        for x, y in batches(4):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            assert monitor.step()
            seen.append({n: (p.grad.numpy().copy(), p.detach().numpy().copy())
                         for n, p in model.named_parameters()})
            optimizer.step()
    series = series_of(tmp_path)
    assert series.variables == tuple(n for n, _ in model.named_parameters())
    assert series.layers[:2] == ("0", "0") and series.layers[-1] == "6"
    assert series.shapes[0] == (32, 16)
    assert series.steps.tolist() == [0, 1, 2, 3], "by default: earlier step() calls, 0-based"
    for index, step in enumerate(seen):
        for name, (gradient, weight) in step.items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight))
    assert series.histograms.steps.tolist() == [0, 2]
    counts = series.histograms.counts[1, series.variables.index("2.weight")]
    np.testing.assert_array_equal(counts, reference_histogram(seen[2]["2.weight"][0]))


def test_by_default_every_statistic_every_10th_logged_step_and_the_norms_between(tmp_path):
    """The cheap default (format 1.6): norms and NaN/Inf counts at every logged step, every
    statistic at the first and every 10th logged one, histograms every 100th step. A
    norms-only step is as exact as a full one where it has values, also for the gradients the
    norm alone cannot vouch for (NaN and Inf entries, squares that overflow or underflow, all
    zeros), which take the masked pass."""
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    crafted = {
        3: {"0.weight": float("nan")}, 4: {"0.bias": float("inf")}, 5: {"0.bias": 3e38},
        6: {"2.bias": 1e-30}, 7: {"2.bias": 0.0},
    }
    seen = []
    with GradientMonitor(model, tmp_path, every_n_steps=2) as monitor:
        for step, (x, y) in enumerate(batches(26)):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for name, value in crafted.get(step // 2 if step % 2 == 0 else -1, {}).items():
                dict(model.named_parameters())[name].grad[0] = value
                if value in (0.0, 1e-30):
                    dict(model.named_parameters())[name].grad.fill_(value)
            if monitor.step():
                seen.append({n: (p.grad.numpy().copy(), p.detach().numpy().copy())
                             for n, p in model.named_parameters()})
            optimizer.step()
    series = series_of(tmp_path)
    assert series.steps.tolist() == list(range(0, 26, 2))
    assert series.stats_every == 10
    assert series.full_rows.tolist() == [i % 10 == 0 for i in range(13)]
    for index, step in enumerate(seen):
        for name, (gradient, weight) in step.items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight))
    assert series.stat("nan_count")[3, 0] == 16 and series.stat("inf_count")[4, 1] == 1
    assert np.isfinite(series.stat("l2_norm")[5, 1])
    assert series.stat("l2_norm")[6, 3] > 0, "squares that underflow are not a zero norm"
    assert series.histograms.steps.tolist() == [0]
    with pytest.raises(ValueError, match="statistics must be"):
        monitor.log(30, statistics="some")


@pytest.mark.parametrize("with_optimizer", [False, True], ids=["alone", "optimizer"])
def test_a_norms_only_step_reads_the_weights_only_beside_the_update(tmp_path, monkeypatch,
                                                                    with_optimizer):
    """Format 1.7: without ``optimizer=`` the weight norms wait for the full steps (the
    update/weight ratio, their only every-step reader, needs the update): a norms-only step is
    one multi-tensor norm of the gradients alone, and the tag says so; with it, of the weights
    too, every step."""
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    normed = []
    foreach_norm = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm",
                        lambda tensors, *args: normed.append(len(tensors))
                        or foreach_norm(tensors, *args))
    with GradientMonitor(model, tmp_path, optimizer=optimizer if with_optimizer else None,
                         histograms_every_n_steps=None) as monitor:
        for step, (x, y) in enumerate(batches(4)):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            normed.clear()
            monitor.step()
            if step > 0:  # a norms-only step
                assert normed == [12 if with_optimizer else 6], normed
            optimizer.step()
    series = series_of(tmp_path)
    assert series.full_rows.tolist() == [True, False, False, False]
    assert ("weight_l2_norm" in series.every_step) == with_optimizer
    assert series.every_step == columns.every_step_stats(series.stat_names)
    weight_norms = series.stat("weight_l2_norm")
    assert np.isfinite(weight_norms[0]).all()
    assert np.isfinite(weight_norms[1:]).all() == with_optimizer
    assert np.isnan(weight_norms[1:]).all() == (not with_optimizer)


def test_the_cadences_can_be_set_and_a_step_logged_by_hand_holds_what_it_asks(tmp_path):
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=1)
    with GradientMonitor(model, tmp_path, stats_every_n_steps=1,
                         histograms_every_n_steps=None) as monitor:
        for step, (x, y) in enumerate(batches(3)):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            monitor.step()
        monitor.log(5, statistics="norms")
    series = series_of(tmp_path)
    assert series.stats_every == 1 and series.histograms is None
    assert series.full_rows.tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="stats_every_n_steps"):
        GradientMonitor(model, tmp_path, stats_every_n_steps=0)
    # What readers accept (a reader keeps that many times the rules' windows).
    with pytest.raises(ValueError, match="stats_every_n_steps must be at most 1000"):
        GradientMonitor(model, tmp_path, stats_every_n_steps=1001)


@pytest.mark.parametrize("stats", [("l2_norm",), None], ids=["l2_norm", "defaults"])
def test_a_norms_only_step_logs_the_norms_of_the_clips_own_pass(tmp_path, monkeypatch, stats):
    """`clip_grad_norm_` at a norms-only step takes one pass over the gradients: PyTorch's
    multi-tensor norm, whose per-tensor results are the logged norms (no second one). The
    weights' norms wait for the full steps (no ``optimizer=``, format 1.7)."""
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    calls = []
    foreach_norm = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm",
                        lambda tensors, *args: calls.append(len(tensors)) or foreach_norm(tensors, *args))
    before = []
    with GradientMonitor(model, tmp_path, stats=stats) as monitor:
        for step, (x, y) in enumerate(batches(4)):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if step == 3:  # a NaN entry: counted before the clip spreads it (NaN x every entry)
                model[0].weight.grad[0, 0] = float("nan")
            reference = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            before.append(model[0].weight.grad.numpy().astype(np.float64))
            calls.clear()
            total = monitor.clip_grad_norm_(1.0)
            assert torch.equal(total, reference) or (step == 3 and total.isnan() and reference.isnan())
            tensors = len(list(model.parameters()))
            if step in (1, 2):  # norms-only: the clip's pass alone
                assert calls == [tensors]
            if step == 3:  # a doubted norm: the clip's pass, then the masked pass's norms
                assert calls == [tensors, tensors]
    series = series_of(tmp_path)
    assert series.full_rows.tolist() == [True, False, False, False]
    assert series.stat("nan_count")[3].tolist() == [1, 0, 0, 0, 0, 0]
    # The clip's norms (of the gradients before it) at every step and the weights' at the full
    # one, each a float32 norm within norm_rtol of float64's.
    np.testing.assert_allclose(series.stat("l2_norm")[:3, 0],
                               [np.linalg.norm(g) for g in before[:3]],
                               rtol=norm_rtol(before[0].size))
    if stats is None:
        weight = model[0].weight.detach().numpy().astype(np.float64)
        np.testing.assert_allclose(series.stat("weight_l2_norm")[0, 0], np.linalg.norm(weight),
                                   rtol=norm_rtol(weight.size))
        assert np.isnan(series.stat("weight_l2_norm")[1:]).all()


def test_a_clipped_norms_only_step_with_the_optimizer_logs_the_clips_norms_and_the_weights(
        tmp_path):
    """With ``optimizer=`` a norms-only step also holds the weights' and the update's norms:
    the clip's norms (of the gradients before it) and the weights' (as the step found them)
    reach the host in one copy, each beside its own parameter."""
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gradients, weights = [], []
    with GradientMonitor(model, tmp_path, optimizer=optimizer) as monitor:
        for x, y in batches(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            gradients.append([p.grad.numpy().astype(np.float64) for p in model.parameters()])
            weights.append([p.detach().numpy().astype(np.float64) for p in model.parameters()])
            monitor.clip_grad_norm_(0.01)  # clips: the update is of the clipped gradients
            optimizer.step()
    series = series_of(tmp_path)
    assert series.full_rows.tolist() == [True, False, False]
    for name, arrays in (("l2_norm", gradients), ("weight_l2_norm", weights)):
        # float32 norms of up to 32 x 32 entries, each within norm_rtol of float64's
        np.testing.assert_allclose(series.stat(name),
                                   [[np.linalg.norm(a) for a in step] for step in arrays],
                                   rtol=norm_rtol(32 * 32))
    assert np.isfinite(series.stat("update_l2_norm")).all()


def test_nan_and_inf_are_counted_not_propagated_and_huge_gradients_stay_finite(tmp_path):
    model = torch.nn.Linear(4, 3)
    with GradientMonitor(model, tmp_path) as monitor:
        model.weight.grad = torch.tensor([[1.0, float("nan"), 2.0, 0.0]] * 3)
        model.bias.grad = torch.tensor([3e38, -1e38, float("inf")])  # squares overflow float32
        monitor.step()
    series = series_of(tmp_path)
    assert_row_matches(series, 0, "weight", reference_stats(model.weight.grad.numpy(), model.weight.detach().numpy()))
    assert_row_matches(series, 0, "bias", reference_stats(model.bias.grad.numpy(), model.bias.detach().numpy()))
    assert np.isfinite(series.stat("l2_norm")[0, 1])


def test_a_vanishing_sigmoid_net_is_diagnosed_by_the_plugin_and_the_cli(tmp_path, plugin_client):
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=12)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientMonitor(model, tmp_path / "sigmoid") as monitor:
        for x, y in batches(30):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            monitor.step()
            optimizer.step()
    alerts = tg.diagnose(series_of(tmp_path, "sigmoid"))
    vanishing = {a.layer for a in alerts if a.kind == "vanishing"}
    assert {"0", "2", "4"} <= vanishing and "24" not in vanishing
    client = plugin_client(str(tmp_path))
    served = json.loads(client.get("/data/plugin/gradients/alerts?run=sigmoid&tag=gradients").get_data())
    assert [(a["kind"], a["layer"], a["first_step"]) for a in served["alerts"]] == [
        (a.kind, a.layer, a.first_step) for a in alerts]
    done = subprocess.run([sys.executable, "-m", "tensorboard_gradients", "diagnose", str(tmp_path),
                           "--json", "--fail-on", "vanishing"], capture_output=True, text=True)
    assert done.returncode == 1
    assert len(json.loads(done.stdout)["alerts"]) == len(alerts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_clipped_norms_only_step_without_a_gradient_or_in_bfloat16(tmp_path, monkeypatch,
                                                                     caplog, dtype):
    """A clipped norms-only step whose clip's norms are all it needs (float32: one pass over
    the gradients, the clip's) and one whose norms the monitor computes itself (bfloat16: its
    float32 norms, not the clip's bfloat16 ones) log the same: a missing gradient a missing row
    (NaN norm and size), warned of once, every other norm beside its own parameter."""
    class WithSpare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = sigmoid_mlp(depth=2)
            self.unused = torch.nn.Linear(2, 2)  # never gets a gradient

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(0)
    model = WithSpare().to(dtype)
    calls = []
    foreach_norm = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm",
                        lambda tensors, *args: calls.append(len(tensors)) or foreach_norm(tensors, *args))
    gradients = []
    with caplog.at_level(logging.WARNING, logger="tensorboard_gradients"):
        with GradientMonitor(model, tmp_path, stats=("l2_norm",)) as monitor:
            for step, (x, y) in enumerate(batches(3)):
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x.to(dtype)), y).backward()
                gradients.append([p.grad.double().numpy() for p in model.net.parameters()])
                calls.clear()
                monitor.clip_grad_norm_(1e-3)
                if step and dtype == torch.float32:  # norms-only: the clip's pass alone
                    assert calls == [len(gradients[-1])]
    series = series_of(tmp_path)
    assert series.full_rows.tolist() == [True, False, False]
    unused = [series.variables.index(f"unused.{name}") for name in ("weight", "bias")]
    assert np.isnan(series.stat("l2_norm")[:, unused]).all()
    assert np.isnan(series.stat("size")[:, unused]).all()
    assert len([r for r in caplog.records if "unused.weight" in r.getMessage()]) == 1
    # Norms of the gradients before the clip, computed in float32 (bfloat16 entries are exact
    # in it): each within norm_rtol of float64's for up to 32 x 32 entries.
    np.testing.assert_allclose(series.stat("l2_norm")[:, :len(gradients[0])],
                               [[np.linalg.norm(g) for g in step] for step in gradients],
                               rtol=norm_rtol(32 * 32))


def test_a_clipped_norms_only_step_of_some_parameters_logs_their_weights_beside_them(tmp_path):
    """With ``optimizer=`` and ``include=`` the clip's vector holds every clipped gradient's
    norm, the watched ones among them, and the weights' norms follow it in the same copy:
    each watched parameter's gradient and weight norms land in its own row."""
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    watched = ["2.weight", "4.bias"]
    gradients, weights = [], []
    with GradientMonitor(model, tmp_path, optimizer=optimizer,
                         include=[rf"^{name}$" for name in watched]) as monitor:
        for x, y in batches(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            named = dict(model.named_parameters())
            gradients.append([named[n].grad.double().numpy() for n in watched])
            weights.append([named[n].detach().double().numpy() for n in watched])
            monitor.clip_grad_norm_(0.01)
            optimizer.step()
    series = series_of(tmp_path)
    assert list(series.variables) == watched and series.full_rows.tolist() == [True, False, False]
    for name, arrays in (("l2_norm", gradients), ("weight_l2_norm", weights)):
        # float32 norms of up to 32 x 32 entries, each within norm_rtol of float64's
        np.testing.assert_allclose(series.stat(name),
                                   [[np.linalg.norm(a) for a in step] for step in arrays],
                                   rtol=norm_rtol(32 * 32))


def test_frozen_skipped_missing_warned_once_include_exclude_and_schedules(tmp_path, caplog):
    class WithSpare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = sigmoid_mlp(depth=3)
            self.unused = torch.nn.Linear(2, 2)  # never gets a gradient: a missing row

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(0)
    model = WithSpare()
    model.net[0].requires_grad_(False)  # frozen: not a row
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with caplog.at_level(logging.WARNING, logger="tensorboard_gradients"):
        with GradientMonitor(model, tmp_path / "all", every_n_steps=3,
                             histograms_every_n_steps=2) as monitor, \
             GradientMonitor(model, tmp_path / "weights_only", exclude=r"bias$",
                             include=[r"^net\.\d", "unused"]) as filtered:
            for step, (x, y) in enumerate(batches(7)):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                monitor.step()
                filtered.step(step=100 + step)
                optimizer.step()
    series = series_of(tmp_path, "all")
    assert "net.0.weight" not in series.variables and "unused.weight" in series.variables
    assert series.steps.tolist() == [0, 3, 6]
    assert series.histograms.steps.tolist() == [0, 2, 4, 6]
    assert series.missing[:, series.variables.index("unused.weight")].all()
    assert np.isnan(series.stat("size")[:, series.variables.index("unused.bias")]).all()
    # Each monitor warns once (not every step); only the first one watches unused.bias.
    assert len([r for r in caplog.records if "unused.weight" in r.getMessage()]) == 2
    assert len([r for r in caplog.records if "unused.bias" in r.getMessage()]) == 1
    filtered_series = series_of(tmp_path, "weights_only")
    assert filtered_series.variables == ("net.2.weight", "net.4.weight", "net.6.weight",
                                         "unused.weight")
    assert filtered_series.steps.tolist() == list(range(100, 107))
    with pytest.raises(ValueError, match="no trainable parameter"):
        GradientMonitor(model, tmp_path, include="nothing-matches")
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer"):
        GradientMonitor(model, tmp_path, every_n_steps=0)
    with pytest.raises(ValueError, match="torch.nn.Module"):
        GradientMonitor([p for p in model.parameters()], tmp_path)


def test_sparse_embedding_gradients_are_coalesced_not_densified(tmp_path):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 4, sparse=True)
    model = torch.nn.Sequential(embedding, torch.nn.Flatten(), torch.nn.Linear(12, 1))
    tokens = torch.tensor([[3, 3, 7], [7, 9, 3]])  # repeated rows: their gradients add up
    with GradientMonitor(model, tmp_path) as monitor:
        model(tokens).sum().backward()
        assert embedding.weight.grad.is_sparse
        monitor.step()
    dense = embedding.weight.grad.to_dense().numpy()
    series = series_of(tmp_path)
    assert_row_matches(series, 0, "0.weight", reference_stats(dense, embedding.weight.detach().numpy()))
    assert series.stat("zero_fraction")[0, 0] == pytest.approx(1 - 3 / 50)


def test_summary_writer_run_clipping_amp_accumulation_and_compile(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    writer = SummaryWriter(str(tmp_path / "run"))
    steps_done = 0
    with GradientMonitor(compiled, writer) as monitor:
        for micro_batches in [batches(2, seed=s) for s in range(3)]:  # 2 micro-batches per step
            optimizer.zero_grad()
            for x, y in micro_batches:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(compiled(x), y) / 2
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            monitor.step(total_norm=total_norm, scaler=scaler)
            scaler.step(optimizer)
            scaler.update()
            writer.add_scalar("loss", loss.item(), steps_done)
            steps_done += 1
            clipped_norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
    writer.close()
    series = series_of(tmp_path, "run")
    assert series.variables[0] == "0.weight", "no _orig_mod. prefix from torch.compile"
    # One row per optimizer step, not per backward, at the steps of the loss logged beside it.
    assert series.steps.tolist() == [0, 1, 2]
    logged_norm = np.sqrt(np.nansum(series.stat("l2_norm")[-1] ** 2))
    # float32 per-parameter norms vs a float64 sum: within norm_rtol(parameters) of each other.
    assert logged_norm == pytest.approx(clipped_norm, rel=norm_rtol(sum(p.numel() for p in model.parameters())))
    from tensorboard.backend.event_processing import event_accumulator

    scalars = event_accumulator.EventAccumulator(str(tmp_path / "run")).Reload()
    tags = scalars.Tags()["tensors"] + scalars.Tags()["scalars"]
    assert {"loss", "gradients/global_norm", "gradients/global_norm_before_clipping",
            "gradients/loss_scale"} <= set(tags)
    before = [e for e in scalars.Tensors("gradients/global_norm_before_clipping")]
    assert before[-1].step == 2
    assert [e.step for e in scalars.Scalars("loss")] == series.steps.tolist()
    from tensorboard.util import tensor_util

    assert float(tensor_util.make_ndarray(before[-1].tensor_proto)) > 1e-3 * 10  # it was clipped


def _scalar_values(run_dir, tag):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    events = event_accumulator.EventAccumulator(str(run_dir)).Reload().Tensors(tag)
    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events}


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_clips_as_pytorch_does_and_logs_the_gradients_before_it(tmp_path,
                                                                                norm_type):
    import copy

    torch.manual_seed(0)
    model = sigmoid_mlp(depth=3)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    before = []
    # The biases are not watched, and still clipped: what clip_grad_norm_(model.parameters()) does.
    with GradientMonitor(model, tmp_path, exclude=r"\.bias$") as monitor:
        for step, (x, y) in enumerate(batches(4)):
            for net, opt in ((model, optimizer), (reference, reference_optimizer)):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
            before.append({n: p.grad.numpy().copy() for n, p in model.named_parameters()})
            total = monitor.clip_grad_norm_(0.05, norm_type, step=10 * step)
            expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05, norm_type)
            # The same function on the same gradients: bit for bit.
            assert torch.equal(total, expected)
            assert all(torch.equal(p.grad, q.grad)
                       for p, q in zip(model.parameters(), reference.parameters()))
            optimizer.step()
            reference_optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    series = series_of(tmp_path)
    assert series.steps.tolist() == [0, 10, 20, 30]
    assert not any(name.endswith(".bias") for name in series.variables)
    for index, gradients in enumerate(before):  # logged before clipping
        for name in series.variables:
            assert_row_matches(series, index, name, reference_stats(gradients[name]))
    totals = _scalar_values(tmp_path, "gradients/global_norm_before_clipping")
    coefficients = _scalar_values(tmp_path, "gradients/clip_coefficient")
    assert sorted(totals) == sorted(coefficients) == [0, 10, 20, 30]
    for index, gradients in enumerate(before):
        whole = np.concatenate([g.ravel() for g in gradients.values()]).astype(np.float64)
        expected_total = np.linalg.norm(whole, norm_type)
        # float32 norms of 1,700 entries against float64: within norm_rtol of each other.
        assert totals[10 * index] == pytest.approx(expected_total, rel=norm_rtol(whole.size))
        assert coefficients[10 * index] == pytest.approx(min(1.0, 0.05 / (totals[10 * index]
                                                                            + 1e-6)))
    assert min(coefficients.values()) < 1.0, "these gradients were clipped"


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
@pytest.mark.parametrize("foreach", [None, False])
def test_clip_grad_norm_of_gradients_in_two_dtypes_and_with_a_graph_clips_as_pytorch_does(
        tmp_path, foreach):
    """The monitor scales the groups of its own pass (`torch_clip.PendingClip.run`): with two
    dtypes (two groups, their norms promoted), per tensor (``foreach=False``) and gradients
    that carry a graph (``create_graph=True``), the same bits as PyTorch's function, and no
    graph recorded by the scaling."""
    import copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Sigmoid(),
                                torch.nn.Linear(32, 4))
    model[2].double()
    reference = copy.deepcopy(model)
    with GradientMonitor(model, tmp_path, stats_every_n_steps=2) as monitor:
        for step, (x, y) in enumerate(batches(4)):
            for net in (model, reference):
                net.zero_grad()
                logits = net[2](net[1](net[0](x)).double())
                torch.nn.functional.cross_entropy(logits, y).backward(create_graph=True)
            total = monitor.clip_grad_norm_(0.05, foreach=foreach, step=step)
            expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05,
                                                      foreach=foreach)
            assert torch.equal(total, expected)
            for p, q in zip(model.parameters(), reference.parameters()):
                assert torch.equal(p.grad, q.grad)
                assert type(p.grad.grad_fn) is type(q.grad.grad_fn)
    assert series_of(tmp_path).steps.tolist() == [0, 1, 2, 3]


def test_clip_grad_norm_logs_a_non_finite_step_before_it_refuses_to_clip(tmp_path):
    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    with GradientMonitor(model, tmp_path) as monitor:
        x, y = batches(1)[0]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        model[0].weight.grad[0, 0] = float("nan")
        unclipped = model[2].weight.grad.clone()
        with pytest.raises(RuntimeError, match="non-finite"):
            monitor.clip_grad_norm_(1.0, error_if_nonfinite=True, step=7)
        assert torch.equal(model[2].weight.grad, unclipped), "refused before clipping, as PyTorch"
        # Without the check it clips as PyTorch does (here: every gradient becomes NaN).
        total = monitor.clip_grad_norm_(1.0, step=8)
        assert torch.isnan(total) and torch.isnan(model[2].weight.grad).all()
    series = series_of(tmp_path)
    assert series.steps.tolist() == [7, 8]
    row = series.variables.index("0.weight")
    assert series.stat("nan_count")[:, row].tolist() == [1, 1]
    assert series.stat("nan_count")[0].sum() == 1, "logged before clipping spread the NaN"


def test_clip_grad_norm_refuses_a_deepspeed_engine_with_the_fix():
    class Engine(torch.nn.Module):  # DeepSpeed's engine interface (DeepSpeed is not installed)
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 1)

        def zero_optimization_stage(self):
            return 0

        def is_gradient_accumulation_boundary(self):
            return True

    monitor = GradientMonitor(Engine(), "unused")
    with pytest.raises(ValueError, match="gradient_clipping"):
        monitor.clip_grad_norm_(1.0)


DDP_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from tensorboard_gradients.torch import GradientMonitor

    def main(rank, logdir):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
        dist.init_process_group("gloo", rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(rank)  # different data per rank
        monitor = GradientMonitor(model, os.path.join(logdir, f"rank{rank}"))
        for step in range(5):
            optimizer.zero_grad()
            x = torch.randn(16, 4, generator=generator)
            model(x).pow(2).mean().backward()
            grads = [p.grad.clone() for p in model.parameters()]  # as logged: before clipping
            if sys.argv[3] == "clip":  # every rank clips; PyTorch's clip of a copy agrees
                copies = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
                for copy, gradient in zip(copies, grads):
                    copy.grad = gradient.clone()
                expected = torch.nn.utils.clip_grad_norm_(copies, 0.01)
                assert torch.equal(monitor.clip_grad_norm_(0.01), expected)
                assert all(torch.equal(p.grad, c.grad) for p, c in zip(model.parameters(), copies))
            else:
                wrote = monitor.step()
                assert wrote == (rank == 0), (rank, wrote)
            optimizer.step()
        monitor.close()
        torch.save(grads, os.path.join(logdir, f"grads{rank}.pt"))
        dist.destroy_process_group()

    if __name__ == "__main__":
        torch.multiprocessing.spawn(main, args=(sys.argv[1],), nprocs=2)
    """
)


@pytest.mark.parametrize("mode", ["step", "clip"])
def test_distributed_data_parallel_only_rank_zero_writes(tmp_path, mode):
    """``clip``: `GradientMonitor.clip_grad_norm_` on every rank, which clips as PyTorch does
    and logs the gradients before clipping."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), port, mode],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tg.read_logdir(str(tmp_path))
    assert list(runs) == ["rank0"] and not (tmp_path / "rank1").exists()
    series = runs["rank0"]["gradients"]
    assert series.variables == ("0.weight", "0.bias", "2.weight", "2.bias"), "no module. prefix"
    assert series.steps.tolist() == [0, 1, 2, 3, 4]
    rank0, rank1 = torch.load(tmp_path / "grads0.pt"), torch.load(tmp_path / "grads1.pt")
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1)), "all-reduced: one gradient"
    last = {name: g.numpy() for name, g in zip(series.variables, rank0)}
    for name, gradient in last.items():
        expected = reference_stats(gradient)
        assert series.stat("l2_norm")[-1, series.variables.index(name)] == pytest.approx(
            expected["l2_norm"], rel=norm_rtol(gradient.size))
    if mode == "clip":
        coefficients = _scalar_values(tmp_path / "rank0", "gradients/clip_coefficient")
        assert sorted(coefficients) == [0, 1, 2, 3, 4] and max(coefficients.values()) < 1


def test_the_torch_monitor_never_imports_tensorflow(tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoTensorFlow(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("tensorflow", "keras"):
                    raise ImportError("blocked for this test: " + name)

        sys.meta_path.insert(0, NoTensorFlow())
        import torch
        from tensorboard_gradients.torch import GradientMonitor
        model = torch.nn.Linear(3, 2)
        with GradientMonitor(model, {str(tmp_path)!r}) as monitor:
            model(torch.ones(4, 3)).sum().backward()
            monitor.step()
        assert "tensorflow" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert series_of(tmp_path).steps.tolist() == [0]


def test_wrapper_prefixes_are_dropped_and_a_monitor_made_before_sharding_says_so(tmp_path):
    from tensorboard_gradients.capture.torch_models import user_parameter_name

    assert user_parameter_name(
        "_fsdp_wrapped_module.layers.0._checkpoint_wrapped_module._orig_mod.weight"
    ) == "layers.0.weight"
    assert user_parameter_name("head_orig_mod.weight") == "head_orig_mod.weight"  # not a wrapper
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    monitor = GradientMonitor(model, tmp_path)
    # What FSDP1 does to a parameter it shards after the monitor saw it: a 1-D view of this
    # rank's part, with a gradient of that size.
    weight = model[0].weight
    weight.data = weight.data.reshape(-1)[:5]
    weight.grad = torch.ones(5)
    model[0].bias.grad = torch.ones(3)
    with pytest.raises(ValueError, match="0.weight has 5 entries, the parameter had 12 .*"
                                         "create the GradientMonitor on the wrapped model"):
        monitor.step()


def test_the_gather_runs_where_the_process_group_can_take_it():
    from tensorboard_gradients.capture.torch_distributed import collective_device

    cpu = torch.device("cpu")
    assert collective_device(["cpu"], cpu) == cpu  # gloo
    assert collective_device(["cpu", "cuda"], torch.device("cuda", 1)) == cpu  # gloo + nccl
    # NCCL alone (init_process_group("nccl"), DeepSpeed's default) has no CPU backend.
    assert collective_device(["cuda"], torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert collective_device(["cuda"], cpu) == torch.device("cuda")
    assert collective_device([], cpu) == cpu


def test_pieces_of_more_than_2_to_the_24_entries_keep_exact_counts():
    from tensorboard_gradients.capture.torch_distributed import exact_counts
    from tensorboard_gradients.capture.torch_ops import TorchOps
    from tensorboard_gradients.format import statistics

    # float32 rounds 2**24 + 1 to 2**24: counted in float32, rank 0 would see one implicit
    # zero against the exact size and log min 0 for gradients that are all 1.
    size = 2**24 + 1
    entries = [(torch.ones(size), size)]
    reductions, _ = statistics.reduction_matrix(TorchOps, entries, torch.float32)
    exact = exact_counts(reductions.to(torch.float64), entries).numpy()
    stats = statistics.statistics_from_reductions(
        statistics.NumpyOps, exact, np.array([float(size)]))
    names = columns.stats_for(with_weights=False, with_updates=False)
    assert stats[0, names.index("min")] == 1.0
    assert stats[0, names.index("zero_fraction")] == 0.0


def test_an_empty_shard_among_others_keeps_the_fast_reductions():
    from tensorboard_gradients.capture.torch_ops import TorchOps
    from tensorboard_gradients.format import statistics

    values = [torch.randn(100), torch.zeros(0), torch.randn(7), torch.randn(7)]
    for stats in (columns.GRADIENT_STATS, columns.REQUIRED_STATS):  # all passes, the fewest
        passes = statistics.passes_for(stats)
        fast = TorchOps.pass_rows(values, passes).double()
        reference = torch.from_numpy(statistics.NumpyOps.pass_rows(
            [v.double().numpy() for v in values], passes))
        # float32 sums of <= 100 entries against float64 ones: <= 100 u relative to the sum of
        # |terms| (Higham 4.4), and |terms| <= 5 for standard normal entries here (squares <= 25).
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=100 * 6e-8 * 25 * 100,
                                   equal_nan=True)


def test_full_steps_queued_together_are_finished_in_one_batch_as_each_alone(monkeypatch):
    from tensorboard_gradients.capture import torch_statistics
    from tensorboard_gradients.capture.torch_ops import TorchOps
    from tensorboard_gradients.format import statistics

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(8, 5, generator=generator), torch.randn(5, generator=generator),
               torch.randn(3, generator=generator)]

    def entries(scale, nan_at=None, missing=False):
        gradients = [scale * torch.randn(w.shape, generator=generator) for w in weights]
        if nan_at is not None:
            gradients[0][nan_at] = float("nan")
        present = [(g, g.numel()) for g in gradients]
        return present[:2] + [None] if missing else present

    # Ordinary steps (the batch), a NaN step and a vanishing one (checked on the spot: the
    # masked pass), a step without one gradient; with and without the weights' norms.
    steps = [(entries(1.0), weights), (entries(3.0, nan_at=(1, 2)), weights),
             (entries(1e-25), weights), (entries(0.5, missing=True), weights),
             (entries(2.0), None), (entries(1.0), weights)]
    runs = []
    original = statistics.statistics_from_reductions
    monkeypatch.setattr(statistics, "statistics_from_reductions",
                        lambda *args: runs.append(len(args[1])) or original(*args))
    alone = []
    for step_entries, step_weights in steps:
        single = torch_statistics.FullSteps(columns.GRADIENT_STATS)
        alone.append(single.matrix(TorchOps, step_entries, torch.float32, step_weights).finish())
    assert runs == [3] * 6
    runs.clear()

    full_steps = torch_statistics.FullSteps(columns.GRADIENT_STATS)
    pending = [full_steps.matrix(TorchOps, e, torch.float32, w) for e, w in steps]
    finished = [pending[index].finish() for index in (3, 0, 1, 2, 4, 5)]
    # The four trusted steps in one run per kind (with the weights' norms, without), the NaN
    # and vanishing steps alone; rows equal to the bit: every formula works row by row.
    assert sorted(runs) == [3, 3, 3, 9]
    for index, matrix in zip((3, 0, 1, 2, 4, 5), finished):
        np.testing.assert_array_equal(matrix, alone[index])
    assert np.isnan(alone[3][2]).all() and not np.isnan(alone[3][:2, 0]).any()
    assert alone[1][0, columns.stats_for(True, False).index("nan_count")] == 1

    # Steps never finished (refused by a stuck queue) are let go past MOST_WAITING; one
    # finished after all computes its own rows.
    monkeypatch.setattr(torch_statistics.Batched, "MOST_WAITING", 2)
    pending = [full_steps.matrix(TorchOps, entries(1.0), torch.float32, weights)
               for _ in range(4)]
    assert len(full_steps._trusted._waiting) == 2
    for matrix in (pending[0].finish(), pending[3].finish()):
        assert matrix.shape == alone[0].shape and np.isfinite(matrix[:, 0]).all()


def test_each_distinct_piece_is_counted_once_by_its_first_rank():
    from tensorboard_gradients.capture.torch_distributed import counted_pieces

    rng = np.random.default_rng(0)
    for _ in range(200):
        ranks, parameters = rng.integers(1, 9), rng.integers(1, 12)
        keys = rng.integers(-1, 3, (ranks, parameters, 4)).astype(float)
        keys[rng.random((ranks, parameters)) < 0.2] = np.nan  # ranks off the piece's mesh
        expected = np.zeros((ranks, parameters), dtype=bool)
        for parameter in range(parameters):
            seen = set()
            for rank in range(ranks):
                key = tuple(keys[rank, parameter])
                if not np.isnan(key).any() and key not in seen:
                    seen.add(key)
                    expected[rank, parameter] = True
        np.testing.assert_array_equal(counted_pieces(keys), expected)


def test_a_tensorboardx_writer_is_a_run_to_join_and_the_steps_match_its_loss(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing import event_accumulator

    torch.manual_seed(0)
    model = sigmoid_mlp(depth=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = tensorboardX.SummaryWriter(str(tmp_path / "run"))
    with GradientMonitor(model, writer, every_n_steps=2) as monitor:
        for step, (x, y) in enumerate(batches(5)):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            writer.add_scalar("loss", loss.item(), step)
            monitor.step(step)
            optimizer.step()
    writer.close()
    assert sorted(tg.read_logdir(str(tmp_path))) == ["run"], "one run: the writer's"
    loss_steps = [e.step for e in event_accumulator.EventAccumulator(
        str(tmp_path / "run")).Reload().Scalars("loss")]
    assert series_of(tmp_path, "run").steps.tolist() == loss_steps[::2] == [0, 2, 4]


def test_a_log_dir_that_is_neither_a_path_nor_a_writer_is_refused():
    with pytest.raises(ValueError, match="log_dir must be a directory path or a SummaryWriter"):
        GradientMonitor(sigmoid_mlp(depth=1), 42)
    with pytest.raises(ValueError, match="got dict"):
        tg.GradientWriter({"logdir": "x"})
