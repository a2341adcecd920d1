"""The import structure of `ppm_trl`: the graph drawn from every `import` statement of every module — at the top or
inside a function, absolute or relative — has no circles (issue 31 item 3), and no edge points up the Layers table of
docs/design.md (issue 42): that table is the test's input. Pure `ast`: nothing is imported."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

ROOT = Path(__file__).resolve().parents[2]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} of every module of `package` under `root` (a package is its `__init__.py`)."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: the modules of `package` it imports}. `from a import b` is an edge to `a.b` when that is a module,
    else to `a`; `import a.b.c` to the longest prefix that is a module."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]  # the package relative imports start from
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in modules:
                        target = target.rpartition(".")[0]
                    if target:
                        edges.add(target)
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        edges.add(f"{source}.{alias.name}")
                    elif source in modules:
                        edges.add(source)
            elif named := _named_module(node, package):  # imports by name
                while named and named not in modules:
                    named = named.rpartition(".")[0]
                if named:
                    edges.add(named)
        edges.discard(name)
        graph[name] = edges
    return graph


def _named_module(node: ast.AST, package: str) -> str | None:
    """The module of `package` a node imports by name: a registry entry's "pkg.mod:Name" string, or the literal
    argument of `importlib.import_module("pkg.mod")`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        match = re.fullmatch(rf"({re.escape(package)}(?:\.\w+)*):\w+", node.value)
        return match.group(1) if match else None
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and (
                first.value == package or first.value.startswith(package + ".")):
            return first.value
    return None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_ppm_trl_has_no_import_cycle():
    graph = import_graph(ROOT, "ppm_trl")
    # the graph is the real one: the entry point reaches each subcommand, and the transports their shared errors
    assert {"ppm_trl.train", "ppm_trl.evaluate"} <= graph["ppm_trl.cli"]
    assert "ppm_trl.judge.errors" in graph["ppm_trl.judge.litellm_http"]
    assert "ppm_trl.judge.litellm_http" in graph["ppm_trl.judge.transport"]  # a lazy import counts too
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("lazy", [False, True])
def test_a_cycle_is_found(tmp_path, lazy):
    """The check sees a loop, also one closed by an import inside a function, and through relative imports."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    back = "def f():\n    from .. import a\n" if lazy else "from pkg import a\n"
    (package / "sub" / "b.py").write_text(back)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert set(find_cycle(graph)) == {"pkg.a", "pkg.sub.b"}


# ---------------------------------------------------------------------------------------------------------------
# The Layers table of docs/design.md
# ---------------------------------------------------------------------------------------------------------------

DESIGN = ROOT / "docs" / "design.md"
LEFT_COLUMN = 37  # the table's module column; the description starts after it


def layer_rows(design_text: str) -> list[list[str]]:
    """The Layers table's rows, top first: each a list of the top-level names it holds (`cli`, `trainers`, ...)."""
    section = design_text.split("## Layers", 1)[1]
    table = section.split("```", 2)[1]
    rows, current = [], []
    for line in table.splitlines()[1:]:
        if not line.strip():
            if current:
                rows.append(current)
            current = []
            continue
        current += [token.rstrip("/").removesuffix(".py") for token in line[:LEFT_COLUMN].split()]
    if current:
        rows.append(current)
    return rows


def upward_imports(graph: dict[str, set[str]], rows: list[list[str]], package: str) -> list[str]:
    """Each edge from a module to a module of a higher row (a smaller index), as "a -> b (row i -> row j)"."""
    row_of = {name: index for index, names in enumerate(rows) for name in names}

    def row(module: str) -> int:
        parts = module.split(".")
        return row_of["__init__" if len(parts) == 1 else parts[1]]

    return sorted(f"{a} -> {b} (row {row(a) + 1} -> row {row(b) + 1})" for a, targets in graph.items()
                  for b in targets if row(b) < row(a))


def test_the_layers_table_names_every_top_level_module_once():
    rows = layer_rows(DESIGN.read_text(encoding="utf-8"))
    named = [name for names in rows for name in names]
    present = {path.stem if path.is_file() else path.name for path in (ROOT / "ppm_trl").iterdir()
               if (path.suffix == ".py" or (path / "__init__.py").is_file())}
    assert len(named) == len(set(named)), f"named twice: {sorted(n for n in named if named.count(n) > 1)}"
    assert set(named) == present, f"missing: {sorted(present - set(named))}; not a module: {sorted(set(named) - present)}"
    assert rows[0][:2] == ["__init__", "cli"] and "registry" in rows[-1] and "advantages" in rows[-1]


def test_no_import_points_up_the_layers_table():
    graph = import_graph(ROOT, "ppm_trl")
    # the edges the table cares about are there to be checked: the seam reads the registry by its mechanism's
    # module, methods.py names the composed classes by string
    assert "ppm_trl.registry" in graph["ppm_trl.trainers.common"]
    assert "ppm_trl.composed" in graph["ppm_trl.methods"]
    up = upward_imports(graph, layer_rows(DESIGN.read_text(encoding="utf-8")), "ppm_trl")
    assert up == [], "imports that point up docs/design.md's Layers table:\n" + "\n".join(up)


@pytest.mark.parametrize("how", ["top", "function", "importlib", "registry string"])
def test_an_upward_import_is_found(tmp_path, how):
    """The check sees an import up the table however it is written."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "high.py").write_text("X = 1\n")
    body = {"top": "from pkg import high\n", "function": "def f():\n    from . import high\n",
            "importlib": "import importlib\nhigh = importlib.import_module('pkg.high')\n",
            "registry string": "ENTRY = 'pkg.high:X'\n"}[how]
    (package / "low.py").write_text(body)
    rows = layer_rows("## Layers\n\n```\n__init__.py high.py\n\nlow.py\n```\n")
    assert rows == [["__init__", "high"], ["low"]]
    assert upward_imports(import_graph(tmp_path, "pkg"), rows, "pkg") == ["pkg.low -> pkg.high (row 2 -> row 1)"]
