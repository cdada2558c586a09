"""What docs/architecture.md describes, checked on the source: imports go
one way between the rooms, no two modules import each other (directly or round a loop), only
capture/ imports a training framework, and no module is too long to hold one concept."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parents[1] / "tensorboard_gradients"

# Which rooms each room may import (besides itself). The public modules at the top (keras, torch,
# jax, summary, the package itself) only re-export.
ALLOWED = {
    "format": {"analysis"},
    "analysis": set(),
    "capture": {"format"},
    "server": {"format", "analysis"},
    "cli": {"format", "analysis"},
}
# A module longer than this holds more than one concept: split it by concern (as `format/statistics/`
# and `capture/torch*` are).
MAX_MODULE_LINES = 600
FRAMEWORKS = {"tensorflow", "keras", "torch", "jax", "lightning", "pytorch_lightning", "transformers",
              "accelerate", "optax", "flax", "tensorboardX"}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: pathlib.Path, modules, top_level_only: bool):
    """(our modules imported, top-level packages imported) by one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    ours, external = set(), set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from package import module` imports the module; `from module import name` the module.
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                else node.module
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name.split(".")[0] != "tensorboard_gradients":
                external.add(name.split(".")[0])
            elif name in modules:
                ours.add(name)
    return ours, external


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_rooms_import_only_the_rooms_below_them():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        room = _room(module)
        if room not in ALLOWED:
            continue
        imported, _ = _imports(path, modules, top_level_only=False)
        for other in imported:
            other_room = _room(other)
            if other_room not in (room, "") and other_room not in ALLOWED[room]:
                wrong.append(f"{module} imports {other}")
            if other_room == "" and other != "tensorboard_gradients":
                wrong.append(f"{module} imports the public module {other}")
    assert not wrong, wrong


def test_no_import_cycles_between_modules():
    modules = _modules()
    graph = {m: _imports(p, modules, top_level_only=True)[0] - {m} for m, p in modules.items()}
    # A package's __init__ may import its own modules (it re-exports them); they must not need it.
    state, cycles = {}, []

    def visit(module, trail):
        state[module] = "open"
        for other in graph[module]:
            if state.get(other) == "open":
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_only_capture_imports_a_training_framework():
    modules = _modules()
    found = {
        module: sorted(_imports(path, modules, top_level_only=False)[1] & FRAMEWORKS)
        for module, path in modules.items()
        if _room(module) != "capture"
    }
    assert {m: f for m, f in found.items() if f} == {}


STORE = "tensorboard_gradients.server.store"


def test_the_http_modules_reach_the_storage_only_through_its_interface():
    """`server/`'s HTTP modules import `server.store` (its registry and `RunSource` interface,
    the names its package exports) and nothing inside it; the store imports none of them."""
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        if not module.startswith("tensorboard_gradients.server"):
            continue
        imported, _ = _imports(path, modules, top_level_only=False)
        in_store = module == STORE or module.startswith(STORE + ".")
        for other in imported:
            if not in_store and other.startswith(STORE + "."):
                wrong.append(f"{module} reaches inside the store: {other}")
            if (in_store and module != STORE and other.startswith("tensorboard_gradients.server")
                    and not other.startswith(STORE)):
                wrong.append(f"{module} (the store) imports the HTTP layer: {other}")
    assert not wrong, wrong


def test_no_module_is_longer_than_600_lines():
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines())
               for module, path in _modules().items()}
    assert {m: n for m, n in lengths.items() if n > MAX_MODULE_LINES} == {}
