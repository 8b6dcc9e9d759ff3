"""The package's import graph: no circle, and imports at the top of files.

Two checks on the source (`ast`, no import executed) and one on a fresh interpreter:

- the graph of top-level imports between the package's modules is acyclic (`networkx.find_cycle`);
  an import executes the module it names and its enclosing packages, so `from ..cost import x`
  is an edge to `autoshard.cost` (whose `__init__` imports every cost file);
- every import inside a function is listed below with its reason: an optional or start-up-heavy
  library, or the CLI's per-command imports (`autoshard --help` must not load the solver). No circle
  is hidden by a function-level import any more (`KNOWN_CIRCLES` is empty). A new function-level
  import of a module of the package fails the test: put it at the top of the file, and where that
  makes a circle, move the shared code into a module both sides can import;
- every module imports in a fresh interpreter, one after the other in a fixed order (sorted, then
  reversed).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "autoshard"

# Libraries that are optional (extras) or slow to import, loaded only where used.
LAZY_LIBRARIES = {
    "ortools": "CP-SAT: loaded when a model is solved, not on `import autoshard`",
    "matplotlib": "the what-if report's figures only",
    "numpy": "the what-if report's figures only (with matplotlib)",
    "rich": "terminal progress only when stderr is a terminal",
    "distributed": "dask: optional extra (batch / what-if --scheduler)",
    "dask": "optional extra",
    "torch": "optional",
    "concurrent": "process pools: only for parallel runs",
    "signal": "SIGINT handling only in long runs",
    "threading": "only in long runs",
}

# Files whose function-level imports of the package are allowed wholesale, with the reason.
LAZY_FILES = {
    "autoshard/cli.py": "each command imports what it runs, so `autoshard --help` and the quick commands "
                        "do not load the solver, the what-if stack or the validation runs",
    "autoshard/__init__.py": "`autoshard.solve` / `autoshard.evaluate` resolve on first use (PEP 562 "
                             "`__getattr__`), keeping `import autoshard` light",
}

# Circles still hidden by a function-level import: (importing module, imported module) -> reason.
# Empty: the package has no circle left (issue 32), and a new function-level import that would close
# one fails `test_function_level_imports_are_listed`.
KNOWN_CIRCLES: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _targets(mod: str, path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Modules of the package this import statement executes: those it names (a package whose names
    it reads, submodules it names) and their enclosing packages, less the importer's own ancestors
    where only entered implicitly (Python has begun them before the importer)."""
    explicit: list[str] = []
    if isinstance(node, ast.ImportFrom):
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        if node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
            b = ".".join(base + ([node.module] if node.module else []))
        else:
            b = node.module or ""
        subs = [f"{b}.{a.name}" for a in node.names if f"{b}.{a.name}" in MODULES]
        if b in MODULES and (len(subs) < len(node.names) or not mod.startswith(b + ".")):
            explicit.append(b)
        explicit += subs
    else:
        explicit = [a.name for a in node.names if a.name in MODULES]
    full = set(explicit)
    for t in explicit:
        parts = t.split(".")
        full |= {".".join(parts[:i]) for i in range(1, len(parts)) if not mod.startswith(".".join(parts[:i]) + ".")}
    full.discard(mod)
    return full


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports() -> tuple[nx.DiGraph, list[tuple[str, int, ast.Import | ast.ImportFrom]]]:
    """The top-level import graph, and every import below module level (type-checking blocks aside)."""
    graph: nx.DiGraph = nx.DiGraph()
    nested = []
    for mod, path in MODULES.items():
        graph.add_node(mod)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        typing_only = {id(n) for b in tree.body if _is_type_checking(b) for n in ast.walk(b)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in typing_only:
                continue
            if id(node) in top:
                graph.add_edges_from((mod, t) for t in _targets(mod, path, node))
            else:
                nested.append((mod, node.lineno, node))
    return graph, nested


def test_the_graph_model_sees_a_circle():
    """The graph is built right: an import of `autoshard.cost.step` executes `autoshard.cost`,
    and `from . import X` inside a package's module executes that package's `__init__`."""
    graph, _ = _imports()
    assert graph.has_edge("autoshard.solver.bounds", "autoshard.cost")  # `from ..cost import ...`
    assert graph.has_edge("autoshard.cost", "autoshard.cost.step")  # the package imports its files
    probe = graph.copy()
    probe.add_edge("autoshard.cost.step", "autoshard.solver.search")  # the circle the issue found
    assert nx.find_cycle(probe)


def test_no_import_circle():
    graph, _ = _imports()
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    pytest.fail("import circle: " + " -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}")


def test_function_level_imports_are_listed():
    graph, nested = _imports()
    unlisted, circles = [], Counter()
    for mod, line, node in nested:
        path = MODULES[mod]
        rel = str(path.relative_to(REPO))
        root = ((node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
        local = isinstance(node, ast.ImportFrom) and node.level > 0 or root == "autoshard"
        if rel in LAZY_FILES:
            continue
        if not local:
            if root not in LAZY_LIBRARIES:
                unlisted.append(f"{rel}:{line}: {ast.unparse(node)} (a library: import it at the top)")
            continue
        targets = _targets(mod, path, node)
        known = [t for t in targets if (mod, t) in KNOWN_CIRCLES]
        if known:
            circles[(mod, known[0])] += 1
            continue
        probe = graph.copy()
        probe.add_edges_from((mod, t) for t in targets)
        why = ("it would close a circle: move the shared code to a module both import"
               if not nx.is_directed_acyclic_graph(probe) else "no circle: import it at the top of the file")
        unlisted.append(f"{rel}:{line}: {ast.unparse(node)} ({why})")
    assert not unlisted, "function-level imports not listed in tests/test_imports.py:\n" + "\n".join(unlisted)
    # each listed circle still exists (remove it from KNOWN_CIRCLES once it is taken apart)
    stale = [k for k in KNOWN_CIRCLES if k not in circles]
    assert not stale, f"KNOWN_CIRCLES lists circles no longer hidden by an import: {stale}"


def test_every_module_imports_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')\n"
    for order in (sorted(MODULES), sorted(MODULES, reverse=True)):  # leaves first, then packages first
        proc = subprocess.run([sys.executable, "-c", code, *order], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
