"""The project's shape, checked from its import graph (every `import`, also inside functions, plus the registry's
"module:attribute" strings, which load parts by name):

- the top level is the design's: controller, p4src, topologies, monitor, experiments, tests, setup.py, plus
  dataplanes, mbalancer, install, docs and the usual files;
- no import cycle between modules;
- each part imports only its own floor and those below it, bottom to top: mbalancer (the protocol, packets, settings,
  processes) < dataplanes < mbalancer.config and its reference (read every data plane's section through the
  registry) < monitor <
  controller < topologies < experiments; command-line modules (`cli`, `__main__`, the benchmark scripts) sit on top
  of all;
- no data plane imports another: dataplanes/<kind>/ imports only dataplanes/*.py and the shared BPF toolkit
  dataplanes/bpf/.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mbalancer", "dataplanes", "monitor", "controller", "topologies", "experiments")
FLOORS = {"mbalancer": 0, "dataplanes": 1, "mbalancer.config": 2, "mbalancer.config_reference": 2, "monitor": 3,
          "controller": 4, "topologies": 5, "experiments": 6}
ENTRY_POINTS = 99
SHARED_DATAPLANE_PARTS = {"bpf"}
TOP_LEVEL = {"controller", "p4src", "topologies", "monitor", "experiments", "tests", "setup.py", "dataplanes",
             "mbalancer", "install", "docs", "Makefile", "README.md", "setup.cfg", ".ci", ".gitignore"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (the longest known prefix of each name), registry strings included."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
            module = node.value.partition(":")[0]
            targets = [module] if module in modules else []
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def top_level_names(path: Path) -> set[str]:
    """What a module defines or imports at its top level (what `from it import name` can take)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def unresolved_imports() -> list[str]:
    """Imports of a project module or name that does not exist (`from dataplanes.ebpf import program` after
    program moved), also inside functions, where nothing fails until the function runs."""
    modules = project_modules()
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in PACKAGES:
                if node.module not in modules:
                    found.append(f"{name}: no module {node.module}")
                    continue
                defined = top_level_names(modules[node.module])
                found += [f"{name}: {node.module} has no {a.name}" for a in node.names
                          if a.name != "*" and f"{node.module}.{a.name}" not in modules and a.name not in defined]
            elif isinstance(node, ast.Import):
                found += [f"{name}: no module {a.name}" for a in node.names
                          if a.name.split(".")[0] in PACKAGES and a.name not in modules]
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def floor(module: str) -> int:
    leaf = module.rpartition(".")[2]
    if leaf in ("cli", "__main__") or leaf.startswith("bench_"):
        return ENTRY_POINTS
    for prefix in sorted(FLOORS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return FLOORS[prefix]
    raise AssertionError(f"{module} is in no floor")


def dataplane_kind(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "dataplanes" or len(parts) < 3 or parts[1] in SHARED_DATAPLANE_PARTS:
        return None
    return parts[1]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_top_level_is_the_designs():
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name in (".ci", ".gitignore")}
    extra = tracked - TOP_LEVEL - {".venv", "results", "build"} - {p for p in tracked if p.endswith(".egg-info")}
    assert not extra, f"top-level entries the design does not have: {sorted(extra)}"


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_each_part_imports_only_its_floor_and_below():
    upward = [f"{module} -> {target}" for module, targets in graph().items() for target in targets
              if floor(target) > floor(module)]
    assert upward == []


def test_no_data_plane_imports_another():
    crossing = [f"{module} -> {target}" for module, targets in graph().items() for target in targets
                if None is not dataplane_kind(module) != dataplane_kind(target) is not None]
    assert crossing == []


def test_every_import_of_the_project_resolves():
    assert unresolved_imports() == []


def test_the_checks_see_what_they_forbid():
    """The graph finds function-level imports and registry strings, and the checks flag a cycle, an upward import and
    a crossing between data planes (so the tests above cannot pass by seeing nothing)."""
    edges = graph()
    assert "dataplanes.ebpf.driver" in edges["dataplanes.registry"]  # a registry string
    assert "dataplanes.openflow.ovs" in edges["dataplanes.openflow.netns_switch"]  # an import inside a method
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floor("controller.core") > floor("dataplanes.driver") > floor("mbalancer.settings")
    assert floor("dataplanes.cli") == ENTRY_POINTS
    assert dataplane_kind("dataplanes.p4.driver") == "p4" and dataplane_kind("dataplanes.bpf.tables") is None
