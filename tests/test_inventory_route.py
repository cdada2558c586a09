"""The plugin's ``inventory`` route in a real `tensorboard` process, on both loaders: what the
logdir TensorBoard was given holds, which the tab shows when no tag has gradient data, so that a
mistyped path reads as one and a job that never attached a writer is told which entry point its
framework has.
"""

import pytest

from support import TensorBoard, get_json
from tensorboard_gradients.format.inventory import ENTRY_POINTS

LOADERS = ("true", "false")


def _inventory(tensorboard):
    return get_json(tensorboard.base + "/data/plugin/gradients/inventory")


def _entry_points(answer):
    return [(point["framework"], point["entry_point"]) for point in answer["entry_points"]]


@pytest.fixture(scope="module")
def loss_only_logdir(tmp_path_factory):
    """Two runs of a PyTorch job that logged its loss and no gradients."""
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path_factory.mktemp("loss_only")
    for run in ("lr_0.1", "lr_0.01"):
        with SummaryWriter(str(root / run)) as writer:
            for step in range(5):
                writer.add_scalar("train/loss", 2.0 / (step + 1), step)
                writer.add_scalar("train/accuracy", step / 5, step)
    return root


@pytest.mark.parametrize("load_fast", LOADERS)
def test_a_wrong_path_is_named_as_no_directory(tmp_path, load_fast):
    missing = tmp_path / "mnsit_runs"
    with TensorBoard(missing, load_fast=load_fast) as tensorboard:
        assert tensorboard.runs() == {}
        answer = _inventory(tensorboard)
    assert answer["location"] == str(missing)
    assert answer["exists"] is False and answer["found"] == "no such directory"
    assert _entry_points(answer) == [tuple(point) for point in ENTRY_POINTS]


@pytest.mark.parametrize("load_fast", LOADERS)
def test_an_empty_directory_holds_no_event_files(tmp_path, load_fast):
    with TensorBoard(tmp_path, load_fast=load_fast) as tensorboard:
        answer = _inventory(tensorboard)
    assert answer["exists"] is True
    assert answer["found"] == "no event files (nothing has been logged there)"


@pytest.mark.parametrize("load_fast", LOADERS)
def test_a_job_that_logged_only_its_loss_is_told_its_frameworks_entry_point(loss_only_logdir,
                                                                             load_fast):
    with TensorBoard(loss_only_logdir, load_fast=load_fast) as tensorboard:
        tensorboard.wait_for(lambda: "train/accuracy, train/loss" in _inventory(tensorboard)["found"],
                             "both scalar tags to be loaded")
        assert tensorboard.runs() == {}
        answer = _inventory(tensorboard)
    assert answer["exists"] is True and answer["location"] == str(loss_only_logdir)
    assert answer["found"].startswith("2 runs;")
    assert ("PyTorch", "tensorboard_gradients.torch.GradientMonitor") in _entry_points(answer)
