"""A built wheel (non-editable install) carries the package and registers the plugin."""

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHECK = """
import importlib.metadata, json, os, sys, tensorboard_gradients
from tensorboard_gradients.server import plugin
target = sys.argv[1]
dists = [d for d in importlib.metadata.distributions(path=[target]) if d.metadata["Name"] == "tensorboard-gradients"]
points = [e for e in dists[0].entry_points if e.group == "tensorboard_plugins"]
print(json.dumps({"file": tensorboard_gradients.__file__, "points": [[e.name, e.value] for e in points],
                  "loader": points[0].load().__name__, "requires": dists[0].requires,
                  "static_files": sorted(os.listdir(plugin.STATIC_DIR))}))
"""


def test_wheel_installs_and_registers_the_entry_point(tmp_path):
    # Built from a copy: setuptools reuses an in-tree build/ folder, whose files of modules moved
    # or deleted since would ship in the wheel.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True, timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("tensorboard_gradients-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "tensorboard_gradients/server/plugin.py" in names
    assert not any(n.startswith(("tests/", "demo/", "benchmarks/")) for n in names)
    # The tab's ES modules ship as real files (static/ links to frontend/ in the source tree);
    # their Node tests do not.
    modules = {os.path.basename(p) for pattern in ("*.js", "*.css")
               for p in glob.glob(str(ROOT / "frontend" / pattern))}
    assert modules and {n for n in names if n.startswith("tensorboard_gradients/static/")} == {
        f"tensorboard_gradients/static/{m}" for m in modules}
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True, timeout=300,
    )
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(target)],
        capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": ""},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["file"].startswith(str(target))
    assert result["points"] == [["gradients", "tensorboard_gradients.server.plugin:GradientsLoader"]]
    assert result["loader"] == "GradientsLoader"
    assert result["static_files"] == sorted(modules)
    always = [r for r in result["requires"] if "extra ==" not in r]
    assert not [r for r in always if r.startswith(("tensorflow", "torch"))]
    for needed in ("tensorboard", "numpy", "werkzeug"):
        assert any(r.startswith(needed) for r in always)
    optional = [r for r in result["requires"] if "extra ==" in r]
    assert any(r.startswith("tensorflow") and '"tensorflow"' in r for r in optional)
    assert any(r.startswith("torch") and '"torch"' in r for r in optional)
