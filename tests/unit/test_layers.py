"""Imports point one way: a package may import from the layers below its own, never from one
above, nor from a sibling in its own layer. Read from the source's AST (every import, also
the ones inside functions and under TYPE_CHECKING), so a lazy import cannot hide an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom; packages in one layer are independent of each other. bench/ and tests/ sit
# outside: they may import anything.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sketchboard",),  # wiring, settings, CLI
    ("api", "demo"),  # demo: the demo producer, a client of the API over HTTP (the CLI starts it)
    ("aggregates", "lag", "alerts", "dashboard"),  # dashboard: the dashboards resource; its static/ page talks HTTP
    ("query",),  # one resolved query, computed against the store
    ("ingest", "store", "patterns"),  # patterns: the pure matcher, below the pipeline, alerts and api that use it
    ("catalog", "sketches", "stopping"),  # stopping: a stop asked for by a signal, for every process of ours
)


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def layer_violations(root: Path, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """'file:line: a imports b (why)' for every import that points up or sideways."""
    level = {pkg: i for i, layer in enumerate(layers) for pkg in layer}  # 0 is the top
    found = []
    for pkg in sorted(level):
        for path in sorted((root / pkg).rglob("*.py")):
            for line, target in imported_packages(path):
                if target == pkg or target not in level:
                    continue
                where = f"{path.relative_to(root)}:{line}: {pkg} imports {target}"
                if level[target] < level[pkg]:
                    found.append(f"{where} (a layer above)")
                elif level[target] == level[pkg]:
                    found.append(f"{where} (a sibling in the same layer)")
    return found


def test_every_project_package_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    placed = {pkg for layer in LAYERS for pkg in layer}
    assert packages <= placed, f"give these packages a layer in LAYERS: {sorted(packages - placed)}"


def test_imports_point_down_the_layers():
    assert layer_violations(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_finds_an_upward_import_even_inside_a_function(tmp_path):
    root = _tree(tmp_path, {
        "store/__init__.py": "",
        "store/lag.py": "def f():\n    from lag.model import Verdict\n",
        "lag/__init__.py": "",
        "lag/model.py": "from store.lag import LagSample\n",
    })
    layers = (("lag",), ("store",))
    assert layer_violations(root, layers) == ["store/lag.py:2: store imports lag (a layer above)"]


def test_the_check_finds_an_import_between_siblings(tmp_path):
    root = _tree(tmp_path, {
        "alerts/rules.py": "import lag.model\n",
        "lag/model.py": "import os\n",
    })
    assert layer_violations(root, (("alerts", "lag"),)) == ["alerts/rules.py:1: alerts imports lag (a sibling in the same layer)"]
