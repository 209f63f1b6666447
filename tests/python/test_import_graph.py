"""python/h5ddp_torch's modules import each other without a circle (issue 56). Every module of the package is
parsed with ast (never imported: no torch, no h5py needed) and every import of a module of the package is an
edge, wherever it stands: at the top, inside a function (an import hidden there is how a circle survives), under
an `if`; in each of the forms

    from . import x            from .x import y            from .. import x (in a subpackage)
    import h5ddp_torch.x       from h5ddp_torch import x   from h5ddp_torch.x import y
    importlib.import_module("h5ddp_torch.x") or (".x", ...) with a literal name

`from . import name` where name is no module (`__version__`) is an edge to the package itself (__init__.py):
the module then needs the package half initialised. The package a module sits in is not an edge otherwise (Python
imports it first, but every module would then close a circle through __init__.py, which imports them).

The graph must have no cycle; a cycle found is printed module by module, with the line of each import. The check
is run first on a small package written here, whose circle goes through function-local imports, so that it
cannot pass by seeing nothing. Run directly (ctest python.import_graph) or under pytest."""
import ast
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python", "h5ddp_torch")


def package_modules(pkg_dir):
    """{dotted module name: file} of every .py file under pkg_dir; the package is named after its directory."""
    top = os.path.basename(os.path.normpath(pkg_dir))
    out = {}
    for root, dirs, files in os.walk(pkg_dir):
        dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(root, d, "__init__.py")))
        rel = os.path.relpath(root, pkg_dir)
        prefix = top if rel == "." else top + "." + rel.replace(os.sep, ".")
        for f in sorted(files):
            if f.endswith(".py"):
                out[prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}"] = os.path.join(root, f)
    return out


def _package_of(name, path):
    """The package a module's relative imports start from: itself for an __init__.py, else its parent."""
    return name if os.path.basename(path) == "__init__.py" else name.rpartition(".")[0]


def _resolve(level, module, pkg):
    """The absolute name of `from <level dots><module> import ...` in package `pkg` (None: above the top)."""
    parts = pkg.split(".")
    if level > len(parts):
        return None
    base = ".".join(parts[:len(parts) - level + 1])
    return f"{base}.{module}" if module else base


def imports_of(name, path, known):
    """[(imported module, line)] of module `name`: every import of a module in `known`, at any depth."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    pkg = _package_of(name, path)
    top = name.split(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node.level, node.module, pkg) if node.level else node.module
            if target is None or not (target == top or target.startswith(top + ".")):
                continue
            # `from target import n`: n is a module (an edge to it) or a name defined in target (an edge to
            # target, the package itself for `from . import __version__`); `*` takes target's names.
            names = [a.name for a in node.names]
            edges = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            if target in known and len(edges) < len(names):
                edges.append(target)
            out += [(e, node.lineno) for e in edges]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and _is_import_call(node.func):
            literal = node.args[0].value
            if literal.startswith("."):
                level = len(literal) - len(literal.lstrip("."))
                literal = _resolve(level, literal[level:], pkg) or ""
            if literal in known:
                out.append((literal, node.lineno))
    return out


def _is_import_call(func):
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))


def import_graph(pkg_dir):
    """{module: {imported module: first line}} over the package's modules."""
    mods = package_modules(pkg_dir)
    graph = {}
    for name, path in mods.items():
        edges = {}
        for target, line in imports_of(name, path, mods):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycles(graph):
    """Cycles [m0, m1, ..., m0], shortest first, through every module of every strongly connected component that
    has one (Tarjan), in name order."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []

    def strongconnect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            comps.append(comp)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    cycles = []
    for comp in comps:
        if len(comp) == 1 and min(comp) not in graph.get(min(comp), {}):
            continue
        covered = set()
        for start in sorted(comp):
            if start not in covered:
                cycles.append(_cycle_in(graph, comp, start))
                covered.update(cycles[-1])
    return sorted(cycles)


def _cycle_in(graph, comp, start):
    """A shortest path start -> ... -> start inside the component (breadth first)."""
    prev, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in comp:
                    continue
                if w == start:  # back at the start: the path to v, then the edge v -> start
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(comp)}")


def describe(graph, cycle, files):
    """One line per import of the cycle: importer -> imported (line N of the importer's file)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(files[min(files, key=len)])))
    return "\n".join(f"    {a} -> {b}  (line {graph[a][b]} of {os.path.relpath(files[a], root)})"
                     for a, b in zip(cycle, cycle[1:]))


def check_detects_a_hidden_circle():
    """A package with a circle through its __init__.py (`from . import __version__`) and one a -> b -> c -> a
    of function-local imports only is caught, then the second alone, then no circle without c's import."""
    files = {
        "__init__.py": "__version__ = '1'\nfrom .a import f\n",
        "a.py": "def f():\n    from .b import g\n    return g()\n",
        "b.py": "from . import __version__\n\ndef g():\n    if True:\n        from . import c\n    return c.h()\n",
        "c.py": "import importlib\n\ndef h():\n    import demo_pkg.a\n    return 1\n",
        "d.py": "def k():\n    return importlib.import_module('.c', 'demo_pkg')\n",
    }
    with tempfile.TemporaryDirectory(prefix="h5ddp-import-graph-") as d:
        pkg = os.path.join(d, "demo_pkg")
        os.mkdir(pkg)
        for name, text in files.items():
            with open(os.path.join(pkg, name), "w") as f:
                f.write(text)
        graph = import_graph(pkg)
        expected = {"demo_pkg": {"demo_pkg.a"}, "demo_pkg.a": {"demo_pkg.b"},
                    "demo_pkg.b": {"demo_pkg", "demo_pkg.c"}, "demo_pkg.c": {"demo_pkg.a"},
                    "demo_pkg.d": {"demo_pkg.c"}}
        assert {k: set(v) for k, v in graph.items()} == expected, graph
        cycles = find_cycles(graph)
        assert cycles == [["demo_pkg", "demo_pkg.a", "demo_pkg.b", "demo_pkg"],
                          ["demo_pkg.c", "demo_pkg.a", "demo_pkg.b", "demo_pkg.c"]], cycles
        with open(os.path.join(pkg, "b.py"), "w") as f:
            f.write("def g():\n    from . import c\n    return c.h()\n")
        cycles = find_cycles(import_graph(pkg))
        assert cycles == [["demo_pkg.a", "demo_pkg.b", "demo_pkg.c", "demo_pkg.a"]], cycles  # local imports only
        with open(os.path.join(pkg, "c.py"), "w") as f:
            f.write("def h():\n    return 1\n")
        assert find_cycles(import_graph(pkg)) == [], find_cycles(import_graph(pkg))


def test_detects_a_hidden_circle():
    check_detects_a_hidden_circle()


def test_h5ddp_torch_has_no_import_cycle():
    graph = import_graph(PACKAGE_DIR)
    assert len(graph) >= 10 and "h5ddp_torch.writer" in graph, f"found no package at {PACKAGE_DIR}: {sorted(graph)}"
    assert "h5ddp_torch.state" in graph["h5ddp_torch.writer"], "the parser misses writer.py's imports"
    cycles = find_cycles(graph)
    if cycles:
        files = package_modules(PACKAGE_DIR)
        shown = "\n".join(f"  {' -> '.join(c)}\n{describe(graph, c, files)}" for c in cycles)
        raise AssertionError(f"python/h5ddp_torch has {len(cycles)} import circle(s); move what both sides need "
                             f"into a module below them (a function-local import only hides a circle):\n{shown}")


def main():
    check_detects_a_hidden_circle()
    try:
        test_h5ddp_torch_has_no_import_cycle()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    graph = import_graph(PACKAGE_DIR)
    print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} imports among them, no circle")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
