"""The shape of the code a newcomer has to live in, read with ``ast`` from a checkout (nothing is imported):

    python -m benchmarks.code_shape [--root=DIR] [--out=FILE]

Per top folder (nsqpy/, ipc/, workers/, http_api/): files, lines, the deepest sub-folder count; for workers/ the
files per sub-package, the largest class (lines, methods, distinct ``self.`` attributes, its base classes), the
longest parameter list of any function (numba kernels included), the module importing most modules of its own
folder, and the import graph among workers' modules (arrows, longest chain). ``--root`` reads another checkout
(e.g. a ``git worktree`` of an older commit) so that before and after come from one run of this file. Prints one
JSON line; it measures code, not speed, so the machine's load does not matter.
"""
from __future__ import annotations

import argparse
import ast
import functools
from collections import Counter
from pathlib import Path

from benchmarks.common import emit, environment

TOPS = ("nsqpy", "ipc", "workers", "http_api")
INSTALLED = {"nsqpy": "nsqpy", "ipc": "nsqpy.ipc", "workers": "nsqpy.workers", "http_api": "nsqpy.http_api"}


def _modules(root: Path, top: str) -> dict[str, Path]:
    """Module name -> file, under both namings a checkout has had (``workers.x`` and ``nsqpy.workers.x``)."""
    found = {}
    for path in sorted((root / top).rglob("*.py")):
        parts = list(path.relative_to(root / top).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([top, *parts])] = path
        found[".".join([INSTALLED[top], *parts])] = path
    return found


def _import_targets(tree: ast.AST, modules: dict[str, Path]) -> set[Path]:
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                targets.add(modules[name])
    return targets


def _class_shape(node: ast.ClassDef, source_lines: int) -> dict:
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    attrs = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "self" and isinstance(n.ctx, ast.Store)}
    return {"name": node.name, "lines": node.end_lineno - node.lineno + 1, "methods": len(methods),
            "attributes_set": len(attrs), "bases": [ast.unparse(b) for b in node.bases]}


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)


def shape(root: Path) -> dict:
    out = {}
    for top in TOPS:
        files = sorted((root / top).rglob("*.py"))
        out[top] = {"files": len(files), "lines": sum(len(p.read_text().splitlines()) for p in files),
                    "folders": len({p.parent for p in files})}
    workers = root / "workers"
    files = sorted(workers.rglob("*.py"))
    modules = _modules(root, "workers")
    per_folder = Counter(str(p.parent.relative_to(workers)) for p in files if p.name != "__init__.py")
    graph, classes, longest = {}, [], []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        graph[path] = _import_targets(tree, modules) - {path}
        rel = str(path.relative_to(root))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append(dict(_class_shape(node, 0), file=rel))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                longest.append({"function": node.name, "file": rel, "params": _params(node)})
    # a class and the mixins it inherits from workers/ count as one object
    by_name = {c["name"]: c for c in classes}
    for c in classes:
        mixins = [by_name[b] for b in c["bases"] if b in by_name]
        c["with_bases"] = {"lines": c["lines"] + sum(m["lines"] for m in mixins),
                           "methods": c["methods"] + sum(m["methods"] for m in mixins),
                           "files": len({c["file"], *(m["file"] for m in mixins)})}
    largest = max(classes, key=lambda c: c["with_bases"]["lines"])
    longest.sort(key=lambda f: -f["params"])

    @functools.lru_cache(maxsize=None)
    def depth(path):
        return 1 + max((depth(t) for t in graph[path] if t != path), default=0)

    try:
        floors = max(depth(p) for p in graph)
    except RecursionError:  # an import circle: no chain length
        floors = None
    fan = max(graph, key=lambda p: len(graph[p]))
    out["workers_detail"] = {
        "files_per_folder": dict(sorted(per_folder.items())),
        "largest_object": largest,
        "worker_object": by_name.get("Worker"),
        "longest_parameter_lists": longest[:3],
        "import_arrows": sum(len(t) for t in graph.values()),
        "import_floors": floors,
        "most_imports": {"file": str(fan.relative_to(root)), "imports_of_workers": len(graph[fan])},
    }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", action="append", default=[], help="a checkout to read (repeat: one entry each)")
    ap.add_argument("--out", help="also write the JSON line to this file")
    args = ap.parse_args(argv)
    roots = [Path(r) for r in args.root] or [Path(__file__).resolve().parent.parent]
    emit({**environment(), "checkouts": {str(r): shape(r) for r in roots}}, args.out)


if __name__ == "__main__":
    main()
