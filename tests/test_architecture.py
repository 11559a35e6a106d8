"""The house plan holds: folders by concern, dependencies pointing one way, no cycles, no private imports.

ARCHITECTURE.md describes the layers; these tests read every module's imports (lazy ones inside
functions included) and fail when a change breaks the plan, naming the offending import.
"""

import ast
from pathlib import Path

import pytest

import workshop_utils as wu

PACKAGE = Path(wu.__file__).resolve().parent
# Lower layers never import higher ones: entries -> exercises -> lessons -> parallel -> spine -> system.
LAYERS = {"system": 0, "spine": 1, "parallel": 2, "lessons": 3, "exercises": 4, "": 5}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def layer_of(module: str) -> str:
    """The layer folder a module sits in; "" for the entries at the top (and the package itself)."""
    head = module.split(".")[0]
    return head if head in LAYERS else ""


def imports(path: Path, root: Path = PACKAGE):
    """(module inside the package, names taken from it, line) for every import in the file, lazy ones too."""
    here = module_name(path, root).split(".")
    package_parts = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[:len(package_parts) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.split(".")[0] == "workshop_utils":
                target = node.module.removeprefix("workshop_utils").lstrip(".")
            else:
                continue
            names = []
            for alias in node.names:
                submodule = f"{target}.{alias.name}".strip(".")
                if (root / Path(*submodule.split("."))).with_suffix(".py").exists():
                    yield submodule, [], node.lineno  # `from .parallel import comm_model` names a module
                else:
                    names.append(alias.name)
            if names:
                yield target, names, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workshop_utils."):
                    yield alias.name.removeprefix("workshop_utils."), [], node.lineno


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_sits_in_a_layer_folder_or_is_an_entry():
    entries = sorted(m for m in MODULES if "." not in m and m not in LAYERS and m)
    assert entries == ["classroom", "comm_model", "data", "gpu_check", "handout", "parallel_demos", "portal_check",
                       "postmortem", "reference", "report", "run_notebooks", "train"], \
        "new modules go into system/, spine/, parallel/, lessons/ or exercises/ (ARCHITECTURE.md); entries are commands"
    for module in MODULES:
        assert module == "" or module in LAYERS or layer_of(module) in LAYERS


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_dependencies_point_down_and_no_private_name_crosses_a_module(module):
    if module == "":
        return  # the flat API loads every module lazily, by design
    mine = LAYERS[layer_of(module)]
    for target, names, line in imports(MODULES[module]):
        assert target in MODULES, f"{module}:{line} imports {target}, which is no module of the package"
        assert LAYERS[layer_of(target)] <= mine, \
            f"{module}:{line} imports {target}: {layer_of(module) or 'entries'} may not depend on " \
            f"{layer_of(target) or 'entries'}"
        private = [n for n in names if n.startswith("_") and n != "__version__"]
        assert not private, f"{module}:{line} takes private {private} from {target}: make it public or move it"


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph has none (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in imports(p) if t != m} for m, p in MODULES.items() if m}
    assert find_cycle(graph) == []
    # the search itself finds the cycle that collectives <-> comm_model once had
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_checker_sees_an_upward_and_private_import(tmp_path):
    """A checker that cannot fail proves nothing: a system module reaching up into the spine is caught."""
    (tmp_path / "system").mkdir()
    (tmp_path / "spine").mkdir()
    (tmp_path / "spine" / "trainer.py").write_text("")
    fake = tmp_path / "system" / "errors.py"
    fake.write_text("import os\n\ndef f():\n    from ..spine.trainer import _lr_lambda\n")
    assert list(imports(fake, tmp_path)) == [("spine.trainer", ["_lr_lambda"], 4)]
    assert LAYERS[layer_of("spine.trainer")] > LAYERS[layer_of("system.errors")]


def test_the_flat_api_resolves_every_name_from_the_module_its_table_names():
    from importlib import import_module

    for name, module in wu._EXPORTS.items():
        assert getattr(wu, name) is getattr(import_module(f"workshop_utils.{module}"), name), name


def test_importing_the_training_command_keeps_wu_train_the_function():
    import importlib

    command = importlib.import_module("workshop_utils.train")
    assert callable(wu.train) and wu.train is not command and wu.train.__module__ == "workshop_utils.spine.trainer"
    assert callable(command.main)


CODE = sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "slides").glob("*.py"),
               *(PACKAGE.parent / "benchmarks").glob("*.py")])


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_module_is_read_in_one_sitting(path):
    """The house rule: no module over 600 lines; past it, split along a seam (ARCHITECTURE.md names them)."""
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it along a seam"


def test_architecture_names_every_module_of_the_package():
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    unnamed = [m for m in MODULES if m and m.split(".")[-1] not in text and m not in LAYERS
               and not m.endswith("__main__")]
    assert not unnamed, f"ARCHITECTURE.md does not name: {unnamed}"
