"""The README's quickstarts run as written, one per framework, and their gradients read back."""

import pytest

import code_blocks

QUICKSTARTS = [block for block in code_blocks.blocks(code_blocks.README) if block.language == "python"]
FRAMEWORKS = {  # the import that names each framework's quickstart
    "keras": "from tensorboard_gradients.keras import",
    "pytorch": "from tensorboard_gradients.torch import",
    "lightning": "from tensorboard_gradients.lightning import",
    "transformers": "from tensorboard_gradients.transformers import",
    "jax": "from tensorboard_gradients.jax import gradient_monitor",
    "tensorflow": "from tensorboard_gradients import summary",
}
# Where each quickstart's comments say its run lands, and how many steps it logs: one per
# optimizer update (Keras: 3 epochs of 16 batches; Lightning: 2 of 16; the Trainer: 12 updates,
# every 2nd logged).
RUNS = {"keras": ("keras/train", 48), "pytorch": ("torch", 50),
        "lightning": ("lightning/lightning_logs/version_0", 32), "transformers": ("hf/runs/", 6),
        "jax": ("jax", 50), "tensorflow": ("tf", 100)}
# The loss each logs beside the gradients, drawn above the heatmap.
LOSS_TAGS = {"keras": "batch_loss", "pytorch": "loss", "lightning": "train_loss",
             "transformers": "train/loss"}
MAX_LINES = 15


def _quickstart(framework):
    return next(block for block in QUICKSTARTS if FRAMEWORKS[framework] in block.code)


def test_one_short_quickstart_per_framework():
    assert len(QUICKSTARTS) == len(FRAMEWORKS)
    for framework in FRAMEWORKS:
        block = _quickstart(framework)
        assert not block.excerpt, block.where
        assert len(block.code.splitlines()) <= MAX_LINES, f"{block.where}: longer than {MAX_LINES} lines"


def _scalar_tags(run_directory):
    from tensorboard.backend.event_processing import event_accumulator

    tags = event_accumulator.EventAccumulator(str(run_directory)).Reload().Tags()
    return set(tags["scalars"]) | set(tags["tensors"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_quickstart_runs_and_its_gradients_read_back(framework, tmp_path):
    block = _quickstart(framework)
    done = code_blocks.run_python(block, tmp_path)
    assert done.returncode == 0, f"{block.where}\n{done.stderr[-3000:]}"
    written = code_blocks.gradient_steps(tmp_path / "logs")
    assert len(written) == 1, written
    (run, tag), steps = next(iter(written.items()))
    run_prefix, logged_steps = RUNS[framework]
    assert run.startswith(run_prefix) and tag == "gradients" and steps == logged_steps, written
    if framework in LOSS_TAGS:  # the loss drawn above the heatmap is in the same run
        assert LOSS_TAGS[framework] in _scalar_tags(tmp_path / "logs" / run)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras_quickstart_runs_on_the_other_keras_backends(backend, tmp_path):
    import tensorboard_gradients as tg

    done = code_blocks.run_python(_quickstart("keras"), tmp_path,
                                  env=dict(code_blocks.environment(), KERAS_BACKEND=backend))
    assert done.returncode == 0, done.stderr[-3000:]
    series = tg.read_logdir(str(tmp_path / "logs" / "keras"))["train"]["gradients"]
    assert series.steps[0] == 1 and len(series.steps) == 3 * 16  # 3 epochs of 16 batches
