"""The imports among flashkv's Python modules run one way (issue 23): public modules -> _arrays ->
(lazily) _torch_ops -> _eager, _common -> _array_core, _C. Read from the sources with ast, so
neither torch nor a GPU (nor the built flashkv._C) is needed, and imports inside functions (the
lazy ones) count as edges like the ones at the top of a module."""

import ast
from pathlib import Path

PKG = "flashkv"
PKG_DIR = Path(__file__).resolve().parents[1] / PKG
EXTENSIONS = ("flashkv._C",)  # built, not in the sources; they import no flashkv module


def module_names():
    """{dotted module name: source path (None for an extension)} for every .py file of the
    package (subpackages too) and its extension modules."""
    names = dict.fromkeys(EXTENSIONS)
    for path in sorted(PKG_DIR.rglob("*.py")):
        parts = (PKG,) + path.relative_to(PKG_DIR).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name, path, modules):
    """The package modules that module `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()

    def add(target):
        # The longest prefix that is one of the package's modules: "flashkv.cascade.merge_state"
        # (a name imported from a module) is an edge to flashkv.cascade.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG or alias.name.startswith(PKG + "."):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = base + ("." + node.module if node.module else "")
            else:
                target = node.module or ""
            if target != PKG and not target.startswith(PKG + "."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in modules else target)
        elif isinstance(node, ast.Call):
            # Imports by string would hide edges from this test: only non-flashkv ones are allowed.
            fn = node.func
            fn_name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            if fn_name in ("__import__", "import_module") and node.args:
                arg = node.args[0]
                assert (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        and not arg.value.startswith((".", PKG))), (
                    f"{path.name}:{node.lineno}: {fn_name}() of a flashkv module (or of a "
                    f"computed name) hides an import from this test; use an import statement")
    return found


def import_graph():
    modules = module_names()
    return {name: imports_of(name, path, modules) if path else set()
            for name, path in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state, stack = {}, []  # state: 1 on the stack, 2 done

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def is_public(name):
    """The package itself and every module whose own name does not start with "_"."""
    return name == PKG or not name.rpartition(".")[2].startswith("_")


def reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_sees_top_level_and_lazy_imports():
    """The parser finds the edges it must (else the tests below would pass on an empty graph)."""
    g = import_graph()
    assert {"flashkv.cascade", "flashkv.page", "flashkv.rope", "flashkv._arrays"} <= g[PKG]
    assert "flashkv._arrays" in g["flashkv.cascade"]  # `from . import _arrays as A`
    assert "flashkv.prefill" in g["flashkv.cascade"]  # `from .prefill import ...`
    assert "flashkv._torch_ops" in g["flashkv._arrays"]  # inside load_torch_ops()
    assert "flashkv._eager" in g["flashkv._torch_ops"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_torch_ops_imports_no_public_module():
    """flashkv._torch_ops (and everything it imports, transitively) stays below the public
    modules: the eager bodies it wraps come from flashkv._eager."""
    g = import_graph()
    direct = sorted(m for m in g["flashkv._torch_ops"] if is_public(m))
    assert not direct, f"flashkv._torch_ops imports public modules {direct}"
    below = sorted(m for m in reachable(g, "flashkv._torch_ops") if is_public(m))
    assert not below, f"flashkv._torch_ops reaches public modules {below} through its imports"


def test_torch_ops_dependencies_do_not_import_arrays():
    """_arrays loads _torch_ops, so nothing _torch_ops imports may import _arrays (the helpers
    come from _array_core)."""
    g = import_graph()
    assert "flashkv._arrays" not in reachable(g, "flashkv._torch_ops")
    assert g["flashkv._array_core"] <= {"flashkv._C"}, (
        "_array_core imports no other flashkv module (but the extension, which imports none)")
