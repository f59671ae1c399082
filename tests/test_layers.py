"""The house by stage, pinned: data flows one way (ingest -> detection -> report / alerts; state and
watch around them; the CLI and the public face on top), no module imports another in a circle, and
no room outgrows what a reader takes in at once. Imports are read from the source (every `import`,
lazy ones inside functions too), so a shortcut taken in a hurry fails here, not in review."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lossguard"

FLOORS = {
    "ground": 0,  # model, errors, silences, escaping, display, redact, tomlio, validate, version
    "ingest": 1,
    "detection": 2,
    "report": 3,
    "state": 3,
    "alerts": 4,
    "watch": 5,
    "cli": 6,
    "face": 7,  # lossguard/__init__.py, api.py, __main__.py
}
"""Each stage may import its own floor's modules and those below, never above; report and state
stand side by side and neither imports the other."""

FACE = {"lossguard", "lossguard.api", "lossguard.__main__"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _stage(module: str) -> str:
    if module in FACE:
        return "face"
    top = module.split(".")[1]
    return top if top in FLOORS else "ground"


def _imports(module: str, path: Path) -> set[str]:
    """The lossguard modules `module` imports (a `from x import name` counts as x unless name is a
    module of its own)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            subs = {f"{base}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= subs
            if len(subs) < len(node.names) and base in MODULES:
                found.add(base)
    found.discard(module)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_no_module_imports_a_stage_above_its_own():
    upward = [
        f"{module} ({_stage(module)}) imports {target} ({_stage(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if _stage(target) != _stage(module) and FLOORS[_stage(target)] >= FLOORS[_stage(module)]
    ]
    assert upward == []


def test_no_modules_import_each_other_in_a_circle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            circle = []
            while (top := stack.pop()) != module:
                circle.append(top)
            if circle:
                circles.append(sorted([module, *circle]))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert circles == []


def test_the_layering_check_sees_an_upward_and_a_circular_import(tmp_path):
    """The two checks above read real imports: a module of ingest importing the daemon is seen."""
    fake = tmp_path / "lossguard" / "ingest" / "reader.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..watch import follow\nfrom . import table\n")
    assert _imports("lossguard.ingest.reader", fake) == {"lossguard.watch.follow", "lossguard.ingest.table"}
    assert FLOORS[_stage("lossguard.watch.follow")] > FLOORS[_stage("lossguard.ingest.reader")]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_500_lines_nor_a_function_over_80(module):
    source = MODULES[module].read_text()
    limit = 250 if module == "lossguard.watch.follow" else 500  # the daemon's pass reads in one sitting
    lines = len(source.splitlines())
    assert lines <= limit, f"{module}: {lines} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []
