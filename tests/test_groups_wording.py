"""How a finding names its subjects: a PyTorch ``nn.Sequential``'s layers are "0", "2", "4"...,
so a finding about layers names its first one as "layer 0" (as each alert's own message does),
never as a bare number ("first 0." read as a count). Real parts: a deep sigmoid
``nn.Sequential`` trained with the PyTorch `GradientMonitor`, read back from its event files.
"""

import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import groups

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sequential_run(tmp_path_factory):
    """The findings of 40 steps of a 12-layer sigmoid ``nn.Sequential`` (its input side vanishes)
    and the series they were judged on."""
    from tensorboard_gradients.torch import GradientMonitor

    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(16, 16), torch.nn.Sigmoid()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    run_dir = tmp_path_factory.mktemp("sequential")
    with GradientMonitor(model, str(run_dir)) as monitor:
        for step in range(1, 41):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            monitor.step(step)
            optimizer.step()
    (tags,) = tg.read_logdir(str(run_dir)).values()
    series = tags["gradients"]
    alerts = analysis.diagnose(series)
    return series, alerts, groups.group(alerts, series.variables, series.layers)


def test_a_finding_about_sequential_layers_names_its_first_as_a_layer(sequential_run):
    series, alerts, found = sequential_run
    assert series.layers[:2] == ("0", "0"), "nn.Sequential numbers its layers"
    by_layer = [g for g in found if g.unit == "layer" and g.subjects > 1]
    assert by_layer, "the input side of the deep sigmoid net vanishes"
    for finding in by_layer:
        assert finding.first == "0"  # the field keeps the layer's own name
        assert finding.message.endswith(", first layer 0."), finding.message
        assert f"{finding.subjects} of {finding.of} layers " in finding.message
    # The same words as the alerts it gathers: each names its layer as "layer <name>".
    head = alerts[by_layer[0].alerts[0]]
    assert head.message.startswith("layer 0: ")


def test_a_finding_about_tensors_names_its_first_tensor_as_it_is():
    alerts = [analysis.Alert(kind="nonfinite", rule="count", variable=f"{index}.weight",
                             layer=str(index), first_step=7, last_step=9, steps=3, value=4.0,
                             threshold=0.0, severity="critical", message="")
              for index in (0, 2)]
    (finding,) = groups.group(alerts, ["0.weight", "2.weight", "4.weight"], ["0", "2", "4"])
    assert finding.message == "2 of 3 tensors had NaN/Inf entries at steps 7-9, first 0.weight."

