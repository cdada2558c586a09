"""Every Python example in README.md runs as written."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", EXAMPLES[index]], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(tmp_path.glob("logs/**/events.out.tfevents.*")), "the example wrote no event file"


KERAS_EXAMPLE = next(e for e in EXAMPLES if "from tensorboard_gradients.keras import" in e)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras_example_runs_on_the_other_keras_backends(backend, tmp_path):
    import tensorboard_gradients as tg

    done = subprocess.run(
        [sys.executable, "-c", KERAS_EXAMPLE], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env=dict(os.environ, KERAS_BACKEND=backend))
    assert done.returncode == 0, done.stderr[-3000:]
    series = tg.read_logdir(str(tmp_path / "logs" / "keras"))["train"]["gradients"]
    assert series.steps[0] == 1 and len(series.steps) == 3 * 16  # 3 epochs of 16 batches
