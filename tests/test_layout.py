"""The layout shows the architecture: the layers are stated once (the import contracts), the doc shows them,
no module imports in a cycle, and the top level stays small.

``python tests/test_layout.py`` rewrites the generated "Layers" table of ``docs/architecture.md`` from
``[tool.importlinter]`` in ``pyproject.toml``; the first test fails, naming that command, when they differ.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own TOML reader
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
BEGIN = "<!-- layers:begin: generated from [tool.importlinter] in pyproject.toml by `python tests/test_layout.py` -->"
END = "<!-- layers:end -->"
#: The top level of the package: modules directly in daliload/, at most this many.
MAX_TOP_LEVEL = 12
#: Lines a module of the package may have, at most.
MAX_LINES = 500


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _names(modules: list[str]) -> str:
    return ", ".join(f"`{m}`" for m in modules)


def layers_section(contract_list: list[dict] | None = None) -> str:
    """The doc's generated block: the layers contract as a table, top first, then the other contracts."""
    contract_list = contracts() if contract_list is None else contract_list
    main = next(c for c in contract_list if c["type"] == "layers" and "containers" not in c)
    labels = main["name"].removeprefix("layers:").strip().split(" > ")
    if len(labels) != len(main["layers"]):
        raise ValueError(f"the layers contract's name has {len(labels)} labels for {len(main['layers'])} layers: "
                         f"give each layer one label, top first, separated by ' > '")
    lines = [BEGIN, "", "| layer, top first | modules | within the layer |", "|---|---|---|"]
    for label, layer in zip(labels, main["layers"]):
        independent = ":" not in layer
        modules = [m.strip() for m in layer.replace(":", "|").split("|")]
        within = "" if len(modules) == 1 else ("independent" if independent else "may import each other")
        lines.append(f"| {label} | {_names(modules)} | {within} |")
    lines += ["", "Also checked:", ""]
    for c in contract_list:
        if c is main:
            continue
        if c["type"] == "layers":
            order = " > ".join(f"`{layer}`" for layer in c["layers"])
            lines.append(f"- {c['name']}: in {_names(c['containers'])}, {order}")
        elif c["type"] == "forbidden":
            lines.append(f"- {c['name']}: no import from {_names(c['source_modules'])} reaches "
                         f"{_names(c['forbidden_modules'])}")
        else:
            lines.append(f"- {c['name']}")
    return "\n".join(lines + ["", END])


def _doc_section(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise AssertionError(f"{DOC} has no generated layers block ({BEGIN} ... {END})")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def write_section() -> bool:
    """Rewrite the doc's generated block from the contracts; whether it changed."""
    text = DOC.read_text()
    new = text.replace(_doc_section(text), layers_section())
    if new != text:
        DOC.write_text(new)
    return new != text


def test_the_layers_in_the_architecture_doc_are_the_import_contracts():
    assert _doc_section(DOC.read_text()) == layers_section(), (
        "docs/architecture.md's layers differ from [tool.importlinter] in pyproject.toml: run "
        "`python tests/test_layout.py` to write them from the contracts")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every import between the project's modules (daliload, fallback, benchmarks, examples), wherever it is
    written (module level, functions, ``TYPE_CHECKING``); a script's sibling import (``from visit import x``
    in benchmarks/gpu/) is its sibling file. A parent package's ``__init__`` is not counted for its children,
    as Python runs it first and grimp does not count it either."""
    files = [p for top in ("daliload", "fallback", "benchmarks", "examples") for p in (REPO / top).rglob("*.py")
             if not p.is_symlink()]
    modules = {_module_of(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        siblings = {_module_of(q).rsplit(".", 1)[-1]: _module_of(q) for q in path.parent.glob("*.py")}
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            for dotted in wanted:
                if dotted in modules:
                    targets.add(dotted)
                elif dotted.split(".")[0] in siblings and path.parent.name == "gpu":
                    targets.add(siblings[dotted.split(".")[0]])
        # `from pkg import mod` names mod, not pkg: drop the package when one of its modules was named
        named = {t for t in targets if any(o.startswith(t + ".") for o in targets)}
        graph[name] = (targets - named) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_of_the_project_import_each_other():
    graph = import_graph()
    assert "fallback.options" in graph["fallback.views"]  # the graph holds the project's imports,
    assert "benchmarks.gpu.visit" in graph["benchmarks.gpu.wheelhouse"]  # the scripts' sibling imports too
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check finds one
    assert cycles(graph) == []


def test_the_top_level_is_small_and_no_module_is_long():
    top = sorted(p.name for p in (REPO / "daliload").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    package = [p for top_dir in ("daliload", "fallback") for p in (REPO / top_dir).rglob("*.py") if not p.is_symlink()]
    long = {str(p.relative_to(REPO)): n for p in package if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_importing_the_dali_package_imports_neither_dali_nor_torch():
    """DALI is imported when a pipeline is built: the pre-screen's probe workers use daliload.dali's errors."""
    code = ("import sys; import daliload.dali; from daliload.dali import DaliBatchError, import_dali; "
            "print(sorted(m for m in ('nvidia.dali', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]


if __name__ == "__main__":
    print(f"{DOC}: {'rewritten' if write_section() else 'already up to date'}")
