"""The code blocks of README.md and docs/, and how the docs tests run them.

The convention (docs/contributing.md): every fenced block names its language. ```python blocks
are programs, ```sh blocks shell scripts that must exit 0, and ```console blocks `$ command`
lines each followed by the output it prints; all of them run, in page order, in one fresh
directory per page, unless the line before the fence is `<!-- excerpt -->` (a fragment, or a
command too slow or unsafe to run here). ```text blocks are shown, never run.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Tuple

from terminal import run_in_terminal

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXCERPT_MARK = "<!-- excerpt -->"
RUN_LANGUAGES = ("python", "sh", "console")
SHOWN_LANGUAGES = ("text",)
# The width the CLI's table is laid out for in a ```console block's expected output.
CONSOLE_COLUMNS = 100

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[^\s`]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    excerpt: bool
    indented: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and not self.excerpt


def pages() -> List[pathlib.Path]:
    return [README] + sorted(DOCS.rglob("*.md"))


def blocks(page: pathlib.Path) -> List[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        indent = len(opening.group("indent"))
        found.append(Block(
            page=page, line=index + 1, language=opening.group("language"),
            code="\n".join(line[indent:] for line in lines[index + 1:end]) + "\n",
            excerpt=previous == EXCERPT_MARK, indented=indent > 0))
        index = end + 1
    return found


def environment() -> Dict[str, str]:
    """The user's shell after `source .venv/bin/activate`: the project's tools come first."""
    return dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                COLUMNS=str(CONSOLE_COLUMNS))


def run_python(block: Block, directory: pathlib.Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", block.code], cwd=directory, capture_output=True,
                          text=True, timeout=300, env=env or environment())


def run_sh(block: Block, directory: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=directory,
                          capture_output=True, text=True, timeout=300, env=environment())


_SEPARATOR = "@@@ end of command @@@"


def console_commands(block: Block) -> List[Tuple[str, str]]:
    """(command, expected output) for each `$ ` line of a ```console block."""
    commands = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            commands.append([line[2:], []])
        elif commands:
            commands[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"{block.where}: output before the first '$ ' command")
    return [(command, _normalised("\n".join(output))) for command, output in commands]


def run_console(block: Block, directory: pathlib.Path) -> List[Tuple[str, str, str]]:
    """(command, expected, printed) for each command, run in one shell as a person types them:
    `$?` after a command is that command's exit status."""
    commands = console_commands(block)
    script = "".join(f"{command} 2>&1\n__status=$?; echo '{_SEPARATOR}'; (exit $__status)\n"
                     for command, _ in commands)
    # In a terminal of the documented width, as a reader of the page would run it.
    printed = run_in_terminal(["bash", "-c", script], CONSOLE_COLUMNS, cwd=directory,
                              env=environment()).split(_SEPARATOR + "\n")
    return [(command, expected, _normalised(output))
            for (command, expected), output in zip(commands, printed)]


def _normalised(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def gradient_steps(directory: pathlib.Path) -> Dict[Tuple[str, str], int]:
    """{(run, tag): logged steps} of every gradients series under `directory`, read back as a
    user would; a run or tag that cannot be read is an error."""
    import tensorboard_gradients as tg

    report = tg.read_logdir_report(str(directory))
    assert not report.problems, report.problems
    return {(run, tag): len(series.steps)
            for run, tags in report.runs.items() for tag, series in tags.items()}
