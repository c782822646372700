"""The package's structure: no import cycles, no import against the layer order of docs/architecture.md,
no framework in the framework-free layers, and `import normcheck` registers nothing with torch."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "normcheck"
FRAMEWORK_FREE = ("core", "numerics", "reference", "cases", "engine")
FRAMEWORKS = ("torch", "jax", "flax", "tensorflow", "keras")
# pytest_plugin: loaded by pytest in every run, imports normcheck only when used; __main__: the command
# starts the workers' fork server before it imports the CLI (and with it torch).
LAZY_BY_DESIGN = {"normcheck.pytest_plugin", "normcheck.__main__"}


def layer_order() -> list[tuple[str, list[str]]]:
    """(layer, [path prefixes relative to the repository]) from the ```layers block, bottom first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        name, *rest = line.split()
        layers.append((name, [w for w in rest if w.startswith("normcheck/")]))
    return layers


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str) -> list[tuple[str, bool, int]]:
    """(imported normcheck module or top-level package, at module level?, line) for every import."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        found += [(t, id(node) in top, node.lineno) for t in targets]
    return found


def internal_edges() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}


def layer_of(name: str, layers) -> int:
    rel = str(MODULES[name].relative_to(ROOT))
    for i, (_, prefixes) in enumerate(layers):
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes):
            return i
    raise AssertionError(f"{rel} is in no layer of docs/architecture.md")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(internal_edges()) == []


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_layers():
    layers = layer_order()
    against = [f"{m} ({layers[layer_of(m, layers)][0]}) imports {t} ({layers[layer_of(t, layers)][0]})"
               for m, targets in internal_edges().items() for t in targets
               if layer_of(t, layers) > layer_of(m, layers)]
    assert against == []


def test_no_function_level_imports_of_normcheck_outside_the_lazy_plugin():
    late = [f"{m}:{line} imports {t}" for m in MODULES if m not in LAZY_BY_DESIGN
            for t, at_top, line in imports(m) if t in MODULES and not at_top]
    assert late == []


def test_framework_free_layers_import_no_framework():
    layers = dict(layer_order())
    offenders = [f"{m} imports {t}" for m in MODULES
                 if any(str(MODULES[m].relative_to(ROOT)).startswith(p) for name in FRAMEWORK_FREE
                        for p in layers[name])
                 for t, _, _ in imports(m) if t.split(".")[0] in FRAMEWORKS]
    assert offenders == []


def framework_free_modules() -> list[str]:
    layers = dict(layer_order())
    return sorted(m for m in MODULES if any(str(MODULES[m].relative_to(ROOT)).startswith(p)
                                            for name in FRAMEWORK_FREE for p in layers[name]))


def test_framework_free_layers_load_no_framework_through_other_modules():
    # The static check above sees a module's own imports; this one what importing it loads (the op records the
    # cases and the engine read included), in a fresh interpreter, naming the first module that brings one in.
    code = ("import importlib, sys\n"
            f"frameworks = {FRAMEWORKS!r}\n"
            f"for name in {framework_free_modules()!r}:\n"
            "    importlib.import_module(name)\n"
            "    loaded = sorted(f for f in frameworks if f in sys.modules)\n"
            "    if loaded:\n"
            "        sys.exit(f'importing {name} loads {loaded}')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(framework_free_modules()) > 30  # (the layers' prefixes still name the packages)


def test_the_checker_sees_cycles_and_layer_violations():
    # the helpers themselves: a two-module cycle is found, an acyclic chain is not
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    layers = layer_order()
    assert layer_of("normcheck.core.errors", layers) < layer_of("normcheck.engine.compare", layers) \
        < layer_of("normcheck.cli", layers)
    # relative imports resolve against the package: engine.compare imports the cases package
    assert "normcheck.cases" in {t for t, _, _ in imports("normcheck.engine.compare")}


@pytest.mark.parametrize("op", ["aten::batch_norm_stats", "aten::batch_norm_backward_elemt"])
def test_importing_normcheck_registers_nothing_with_torch(op):
    code = (f"import normcheck, torch; "
            f"print(torch._C._dispatch_has_kernel_for_dispatch_key({op!r}, 'CPU'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
