"""The import structure of `ppm_trl` has no circles (issue 31 item 3): the graph drawn from every `import` statement of
every module — at the top or inside a function, absolute or relative — is acyclic, so each module can be read (and
imported) after the modules it uses. Pure `ast`: nothing is imported."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
        edges.discard(name)
        graph[name] = edges
    return graph


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
