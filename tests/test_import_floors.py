"""The packages' import graph, read with ``ast`` (nothing is imported): no circles, no import reaching up a floor.

Floors, lowest first (a module may import its own floor and the ones below it):

    ipc          shared memory; imports nothing else of ours
    nsqpy        library code that starts no process (protocol, config, store, client, tools, admin, ...)
    workers, http_api   the processes: the broker, the HTTP apps, the entry points of nsqlookupd and nsqadmin

Every import counts, also one inside a function or under ``if TYPE_CHECKING:``: a lazy import still ties the two
modules together (and a circle of lazy imports is one edit away from an ImportError at start). An import names the
deepest module of ours it reaches: ``from workers import fastlane`` is an edge to ``nsqpy.workers.lane.fastlane``, ``from
nsqpy.workers.lane.fastlane import _Peer`` one to ``nsqpy.workers.lane.fastlane``.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"ipc": 0, "nsqpy": 1, "workers": 2, "http_api": 2}
INSTALLED = {"ipc": "nsqpy.ipc", "nsqpy": "nsqpy", "workers": "nsqpy.workers", "http_api": "nsqpy.http_api"}


def _modules() -> dict[str, Path]:
    """Every module of ours by its installed name (setup.cfg's package_dir: ``workers/`` is ``nsqpy.workers``)."""
    found = {}
    for top in FLOORS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = [INSTALLED[top], *path.relative_to(ROOT / top).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _targets(node, name, path, modules)
    return graph


def _targets(node: ast.Import | ast.ImportFrom, name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours one import statement of module ``name`` (file ``path``) reaches."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
        candidates = [f"{base}.{alias.name}" for alias in node.names]
    targets = set()
    for candidate in candidates:
        while candidate and candidate not in modules:
            candidate = candidate.rpartition(".")[0]
        if candidate and candidate != name:
            targets.add(candidate)
    return targets


def _floor(module: str) -> int:
    top = module.split(".")[1] if module.startswith("nsqpy.") else "nsqpy"
    return FLOORS.get(top, FLOORS["nsqpy"])


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
    return found


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete circle through the component's first module, for the failure message."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return component


def test_the_walk_sees_known_edges():
    graph = _graph()
    assert "nsqpy.protocol.kernels" in graph["nsqpy.protocol.v2_parser"]
    assert "nsqpy.ipc.numba_cache" in graph["nsqpy.protocol.kernels"]
    assert "nsqpy.workers.processes.supervisor" in graph["nsqpy.workers.processes.nsqd"]


def test_no_import_circles():
    graph = _graph()
    circles = [" -> ".join(_cycle_in(c, graph)) + f"  (component: {', '.join(c)})" for c in _circles(graph)]
    assert not circles, "import circles among our modules:\n" + "\n".join(circles)


def test_no_import_reaches_up_a_floor():
    graph = _graph()
    upward = sorted(f"{module} imports {target}" for module, targets in graph.items() for target in targets
                    if _floor(target) > _floor(module))
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)
