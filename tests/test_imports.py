"""The package's import graph: every module imports alone, and no two modules import each other in a circle.

The graph is read from the source (``ast``), lazy imports inside functions included: a cycle hidden in a
function body still tells a reader that neither file is the foundation."""

import ast
import sys
from pathlib import Path

from cli_runner import run_cli

PACKAGE = "identifiable_transformers"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The package modules an ``from X import a, b`` names (X itself, and X.a where that is a module)."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def _imported_by_name(node: ast.AST) -> bool:
    """``import_module("<a package module>")`` or ``__import__(...)`` with the name written out."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return func in ("import_module", "__import__") and str(node.args[0].value).startswith(PACKAGE + ".")


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                edges.update(_resolve(name, path.name == "__init__.py", node))
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif _imported_by_name(node):  # importlib.import_module("identifiable_transformers.x"): an import too
                edges.add(node.args[0].value)
        # A module importing its own package's __init__ (``from . import x`` inside x's package) is how Python
        # reaches a sibling, not a dependency on the __init__'s re-exports.
        graph[name] = {e for e in edges if e in modules and e != name and not name.startswith(e + ".")}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_relative_and_lazy_imports():
    graph = import_graph()
    maths = f"{PACKAGE}.diagnostics.maths"
    assert f"{maths}.nullspace" in graph[f"{maths}.key_aware"]
    assert f"{maths}.internals" in graph[f"{maths}.key_aware_heads"]
    # callbacks/identifiability.py imports key_aware_probe inside a method
    callbacks = f"{PACKAGE}.diagnostics.callbacks"
    assert f"{callbacks}.key_aware_probe" in graph[f"{callbacks}.identifiability"]


def test_an_import_by_name_is_an_edge_of_the_graph():
    code = "import importlib\ndef f():\n    return importlib.import_module('identifiable_transformers.hf.data')\n"
    calls = [n for n in ast.walk(ast.parse(code)) if _imported_by_name(n)]
    assert [c.args[0].value for c in calls] == [f"{PACKAGE}.hf.data"]


def test_no_import_cycle():
    cycle = _find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_maths_needs_no_lightning_and_never_imports_upward():
    """diagnostics/maths is the foundation: it imports nothing of the package outside itself and the models,
    and no Lightning, plotting or Captum."""
    maths = f"{PACKAGE}.diagnostics.maths"
    graph = import_graph()  # parsed once, not once per module (3 s)
    for name, path in _modules().items():
        if not name.startswith(maths):
            continue
        text = path.read_text()
        for banned in ("lightning", "matplotlib", "captum", "wandb"):
            assert f"import {banned}" not in text and f"from {banned}" not in text, (name, banned)
        for dep in graph[name]:
            assert dep.startswith(maths) or dep.startswith(f"{PACKAGE}.models"), (name, dep)


# The package's layers, lowest first: a module imports only its own sub-package and those of lower layers
# (the package's __init__, its face, sits above them all). hf/ builds on modules/ (its LightningModule is a
# ClassifierModule); loading.py (a checkpoint -> its model) serves run/ and report/, the top, side by side.
LAYERS = [
    {"common"},
    {"models", "data"},
    {"tracking"},
    {"diagnostics"},
    {"modules"},
    {"hf"},
    {"loading"},
    {"run", "report"},
]


def _layer(module: str) -> tuple[str, int]:
    rest = module.removeprefix(PACKAGE + ".")
    if rest == module:
        return "", len(LAYERS)  # the package's __init__
    top = rest.split(".")[0]
    rank = [i for i, layer in enumerate(LAYERS) if top in layer]
    assert rank, f"{module}: its sub-package {top!r} is in no layer of tests/test_imports.py LAYERS: add it"
    return top, rank[0]


def test_every_sub_package_imports_only_those_below_it():
    bad = []
    for name, deps in import_graph().items():
        top, rank = _layer(name)
        for dep in deps:
            dep_top, dep_rank = _layer(dep)
            if dep_top != top and dep_rank >= rank:
                bad.append(f"{name} -> {dep}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_the_layer_rule_catches_an_upward_import():
    assert _layer(f"{PACKAGE}.data.cache")[1] < _layer(f"{PACKAGE}.hf.data")[1]
    assert _layer(f"{PACKAGE}.common.files")[1] == 0 and _layer(PACKAGE)[1] == len(LAYERS)


def test_the_package_root_holds_only_its_face_and_sub_packages():
    loose = sorted(p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "loading.py"))
    assert not loose, f"modules at the package root: {loose}: put each in the sub-package it belongs to"


def test_every_module_imports_alone(tmp_path):
    """Each module in a clean import state (the package's modules forgotten before each one), in one child: a
    child of tests/cli_runner.py's warm interpreter, where the third-party libraries are already imported (only
    the package's own modules are reset) and ours is not."""
    names = sorted(n for n in _modules() if not n.endswith("__main__"))  # __main__ runs a command line
    code = (
        "import importlib, sys, traceback\n"
        f"assert not any(m.startswith({PACKAGE!r}) for m in sys.modules)\n"
        f"failed = []\nfor name in {names!r}:\n"
        f"    for m in [m for m in sys.modules if m == {PACKAGE!r} or m.startswith({PACKAGE + '.'!r})]:\n"
        "        del sys.modules[m]\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except Exception:\n        failed.append(name + '\\n' + traceback.format_exc())\n"
        "print('\\n'.join(failed))\nsys.exit(1 if failed else 0)\n"
    )
    (tmp_path / "import_each.py").write_text(code)
    proc = run_cli([sys.executable, str(tmp_path / "import_each.py")], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
