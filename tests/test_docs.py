"""Every code block of the docs runs as written, or says it is an excerpt (tests/code_blocks.py).

The README's quickstarts run in tests/test_readme.py; the docs site includes them from there."""

import re

import pytest

import code_blocks

PAGES = code_blocks.pages()
DOC_PAGES = [page for page in PAGES if page != code_blocks.README]
RUNNING_PAGES = [page for page in DOC_PAGES if any(block.runs for block in code_blocks.blocks(page))]
SNIPPET = re.compile(r'^--8<-- "README\.md:(?P<section>[a-z_]+)"$', re.M)
README_SECTION = re.compile(r"^<!-- --8<-- \[start:(?P<section>[a-z_]+)\] -->$", re.M)


def _name(page):
    return str(page.relative_to(code_blocks.ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_code_block_runs_or_is_marked_an_excerpt(page):
    known = code_blocks.RUN_LANGUAGES + code_blocks.SHOWN_LANGUAGES
    for block in code_blocks.blocks(page):
        assert block.language in known, (
            f"{block.where}: a fence names one of {', '.join(known)} (got {block.language!r})")
        assert not block.indented, f"{block.where}: a fence starts at the margin, not inside a list"
        assert not (block.excerpt and block.language in code_blocks.SHOWN_LANGUAGES), (
            f"{block.where}: {code_blocks.EXCERPT_MARK} marks a block that would otherwise run")
    lines = page.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip() == code_blocks.EXCERPT_MARK:
            following = next((later for later in lines[number:] if later.strip()), "")
            assert following.startswith("```"), f"{_name(page)}:{number}: an excerpt mark without its block"


@pytest.mark.parametrize("page", RUNNING_PAGES, ids=_name)
def test_page_code_runs_as_written(page, tmp_path):
    """A page's blocks run in order in one directory, as a reader types them; each Python
    program logs gradients that read back (a new run, or more steps of one)."""
    for block in filter(lambda block: block.runs, code_blocks.blocks(page)):
        if block.language == "python":
            before = code_blocks.gradient_steps(tmp_path)
            done = code_blocks.run_python(block, tmp_path)
            assert done.returncode == 0, f"{block.where}\n{done.stderr[-3000:]}"
            after = code_blocks.gradient_steps(tmp_path)
            assert any(steps > before.get(key, 0) for key, steps in after.items()), (
                f"{block.where}: logged no gradients that read back ({after})")
        elif block.language == "sh":
            done = code_blocks.run_sh(block, tmp_path)
            assert done.returncode == 0, f"{block.where}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        else:
            for command, expected, printed in code_blocks.run_console(block, tmp_path):
                assert printed == expected, f"{block.where}: $ {command}\nprinted:\n{printed}"


def test_console_blocks_are_parsed_into_commands_and_their_output():
    """The parser the page test relies on: a wrong split would compare nothing."""
    cli = code_blocks.DOCS / "cli.md"
    consoles = [block for block in code_blocks.blocks(cli) if block.language == "console"]
    commands = [command for block in consoles for command, _ in code_blocks.console_commands(block)]
    assert commands.count("echo $?") == len(consoles) >= 3
    assert all(expected for block in consoles for _, expected in code_blocks.console_commands(block))


def test_each_readme_quickstart_is_in_its_framework_guide():
    sections = README_SECTION.findall(code_blocks.README.read_text(encoding="utf-8"))
    included = {section: page for page in DOC_PAGES
                for section in SNIPPET.findall(page.read_text(encoding="utf-8"))}
    assert sorted(included) == sorted(sections) and len(sections) == 6, (sections, included)
    for section, page in included.items():
        assert page.parent.name == "guide", f"{section} is included in {_name(page)}"
