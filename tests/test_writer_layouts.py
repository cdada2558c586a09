"""A tag's rows are decided by variable NAMES: writers joining a run never misname rows.

TensorBoard's loaders keep the first metadata of a tag, so a second process writing another
variable set under the same tag would have its numbers shown under the first's names. Each
scenario is checked in the files and through a real `tensorboard` on both loaders.
"""

import urllib.parse

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format.layout import Layout, LayoutTags, MAX_VARIABLE_NAME_LENGTH

from support import TensorBoard, get_json


def gradients(names, scale):
    """One gradient per name whose norm tells the name apart: |g| = scale * (position + 1)."""
    return {name: np.full(4, scale * (i + 1) / 2.0) for i, name in enumerate(names)}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    # Item 3: four "processes" (fresh writers, each starting from the files alone) join a run:
    # the same count of variables, renamed; reordered; then the first set again.
    joined = str(root / "joined")
    for first_step, names in [(0, ["a/w", "b/w"]), (10, ["c/w", "d/w"]), (20, ["b/w", "a/w"]),
                              (30, ["a/w", "b/w"])]:
        with tg.GradientWriter(joined) as writer:
            for step in range(first_step, first_step + 5):
                writer.write(step, gradients(names, 1.0))
    # Item 4: no weights, and one variable's gradient missing on some steps.
    with tg.GradientWriter(str(root / "missing")) as writer:
        for step in range(6):
            grads = gradients(["a/w", "b/w"], 1.0)
            if step % 2:
                grads["b/w"] = None
            writer.write(step, grads)
    return root


EXPECTED_TAGS = {
    "gradients": (("a/w", "b/w"), [0, 1, 2, 3, 4, 30, 31, 32, 33, 34]),
    "gradients_varset2": (("c/w", "d/w"), [10, 11, 12, 13, 14]),
    "gradients_varset3": (("b/w", "a/w"), [20, 21, 22, 23, 24]),
}


def test_each_variable_set_keeps_its_names_in_the_files(logdir):
    joined = tg.read_logdir(str(logdir))["joined"]
    assert {tag: (s.variables, s.steps.tolist()) for tag, s in joined.items()} == EXPECTED_TAGS
    for series in joined.values():
        # Whatever tag it landed in, a row's norm says which name it was written under.
        np.testing.assert_allclose(series.stat("l2_norm"), np.tile([1.0, 2.0], (len(series.steps), 1)))
    missing = tg.read_logdir(str(logdir))["missing"]
    assert list(missing) == ["gradients"]
    assert missing["gradients"].missing[:, 1].tolist() == [False, True] * 3


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_tensorboard_shows_every_variable_set_under_its_own_names(logdir, load_fast):
    with TensorBoard(logdir, load_fast=load_fast) as tb:
        tb.wait_for(lambda: len((tb.runs() or {}).get("joined", {})) == 3
                    and "missing" in (tb.runs() or {}), "both runs")
        runs = tb.runs()
        for tag, (names, steps) in EXPECTED_TAGS.items():
            assert runs["joined"][tag]["steps"] == len(steps)
            query = urllib.parse.urlencode({"run": "joined", "tag": tag, "stat": "l2_norm"})
            heatmap = get_json(f"{tb.base}/data/plugin/gradients/heatmap?{query}")
            assert tuple(heatmap["variables"]) == names and heatmap["steps"] == steps
            assert heatmap["values"] == [[1.0] * len(steps), [2.0] * len(steps)]
        query = urllib.parse.urlencode({"run": "missing", "tag": "gradients", "stat": "l2_norm"})
        heatmap = get_json(f"{tb.base}/data/plugin/gradients/heatmap?{query}")
        assert heatmap["steps"] == list(range(6))
        assert heatmap["classes"] == [["ok"] * 6, ["ok", "missing"] * 3]


def test_layout_tags_tell_sets_apart_by_names_not_counts_or_shapes():
    tags = LayoutTags()
    layout = lambda names, shapes: Layout.create(names, shapes, with_weights=False)  # noqa: E731
    assert tags.tag_for("g", layout(["a", "b"], [(2,), (3,)])) == "g"
    assert tags.tag_for("g", layout(["a", "b"], [(2,), None])) == "g"  # a shape unknown this step
    assert tags.tag_for("g", layout(["b", "a"], [(3,), (2,)])) == "g_varset2"
    known = LayoutTags()
    known.known("g", "g_varset2", layout(["x"], [(1,)]))
    assert known.tag_for("g", layout(["y"], [(1,)])) == "g"
    assert known.tag_for("g", layout(["z"], [(1,)])) == "g_varset3"


def test_overlong_variable_names_are_capped_and_stay_distinct(caplog):
    long_a, long_b = "x" * 70000 + "a", "x" * 70000 + "b"
    layout = Layout.create([long_a, long_b], [(1,), (1,)], with_weights=False)
    assert all(len(v) <= MAX_VARIABLE_NAME_LENGTH for v in layout.variables)
    assert layout.variables[0] != layout.variables[1]
    assert "at most" in caplog.text
