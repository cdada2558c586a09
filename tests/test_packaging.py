"""A built wheel (non-editable install) carries the package and registers the plugin; the sdist
and the wheel build without warnings, pass ``twine check`` and install in a fresh virtualenv,
whose own `tensorboard` then shows the tab."""

import glob
import json
import os
import pathlib
import re
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


def _source_copy(tmp_path):
    """The checkout without its build outputs: setuptools reuses an in-tree build/ folder, whose
    files of modules moved or deleted since would ship in the wheel."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache"))
    return source


def test_wheel_installs_and_registers_the_entry_point(tmp_path):
    source = _source_copy(tmp_path)
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


WRITE_A_RUN = """
import sys, numpy as np
from tensorboard_gradients import GradientWriter
with GradientWriter(sys.argv[1]) as writer:
    for step in range(4):
        writer.write(step, {"dense/kernel": np.ones((3, 2)), "out/kernel": np.full(2, np.nan)
                            if step == 2 else np.ones(2)})
"""


def test_sdist_and_wheel_build_cleanly_and_the_wheel_serves_the_tab_from_a_fresh_venv(
        tmp_path, browser):
    from support import Tab, TensorBoard

    source = _source_copy(tmp_path)
    # The build's own messages, byte-compilation included (this machine's environment turns it off).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
         str(source)], capture_output=True, text=True, env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    # "warning" as a word of the build's messages, not inside a file name (early_warning.py).
    warnings = [line for line in (built.stdout + built.stderr).splitlines()
                if re.search(r"(?<!_)warning(?!_)", line, re.IGNORECASE)]
    assert not warnings, warnings
    (sdist,) = (tmp_path / "dist").glob("tensorboard_gradients-*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("tensorboard_gradients-*.whl")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist),
                              str(wheel)], capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout
    # A fresh virtualenv gets the wheel and its declared dependencies from the package index
    # (this one's pip drives it: no ensurepip needed), so a missing dependency fails here.
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True,
                   timeout=300)
    python = fresh / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    logdir = tmp_path / "logs"
    subprocess.run([str(python), "-c", WRITE_A_RUN, str(logdir / "run1")], check=True,
                   cwd=tmp_path, timeout=300)
    cli = subprocess.run([str(fresh / "bin" / "tensorboard-gradients"), "diagnose", str(logdir)],
                         capture_output=True, text=True, timeout=300)
    # The NaN at step 2 is critical: the installed gate fails on it without any flag.
    assert cli.returncode == 1 and "nonfinite" in cli.stdout and "out/kernel" in cli.stdout, (
        cli.stdout + cli.stderr)
    with TensorBoard(logdir, python=python) as tensorboard:
        tensorboard.wait_for_steps({"run1": 4})
        tab = Tab(browser, tensorboard.base)
        tab.wait_drawn()
        assert tab.page.evaluate("window.gradientsApp.state.run") == "run1"
        assert not tab.errors, tab.errors
        tab.close()


def test_the_framework_extras_keep_the_torch_a_user_already_has(tmp_path):
    """A CPU user installs PyTorch's CPU wheel first (the install docs say so), then the extras:
    pip's real resolver, asked for every framework extra beside that torch, must not replace it
    (a CUDA build and its NVIDIA packages are several GB). The torch here is the test
    environment's own CPU wheel, registered in a fresh virtualenv by its metadata (pip reads
    nothing else to resolve; the 200 MB of the wheel are not needed for that)."""
    import torch  # the CPU wheel the test extra installs

    installed = pathlib.Path(torch.__file__).parents[1] / f"torch-{torch.__version__}.dist-info"
    assert "+cpu" in torch.__version__ and installed.is_dir(), installed
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True,
                   timeout=300)
    python = fresh / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    registered = pathlib.Path(site) / installed.name
    registered.mkdir(parents=True)
    shutil.copy(installed / "METADATA", registered / "METADATA")
    (registered / "RECORD").touch()
    report = tmp_path / "report.json"
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--quiet",
         "--report", str(report), f"{ROOT}[torch,lightning,transformers]"],
        capture_output=True, text=True, timeout=600)
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    names = [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]
    assert "tensorboard-gradients" in names and "lightning" in names and "transformers" in names
    assert not [n for n in names if n == "torch" or n.startswith("nvidia")], names
