"""Every kernel takes its numba options from ``nsqpy.ipc.numba_cache`` (JIT, or JIT_CALLEE for a kernel only kernels call),
and no code outside a kernel names a JIT_CALLEE kernel.

A JIT_CALLEE kernel has no CPython wrapper: called from Python, numba jumps through the missing wrapper and the
process dies with a segmentation fault, not an exception. So this reads the source of every package and of the tests
and benchmarks, and fails on any reference to such a kernel's name (a call, an attribute, a value passed around)
outside the body of an ``@njit`` function. Names are matched, not resolved: a Python function or method that shares a
callee's name fails the test too; rename one of them, or drop JIT_CALLEE from the kernel.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nsqpy", "workers", "ipc", "http_api")
READERS = PACKAGES + ("tests", "benchmarks")
CALLEE_OPTIONS = {"JIT_CALLEE", "KERNEL_CALLEE"}
KERNEL_OPTIONS = {"JIT", "KERNEL"} | CALLEE_OPTIONS


def _jit_decorator(node):
    """The ``@njit(...)`` call among a function's decorators, or None."""
    for dec in node.decorator_list:
        func = dec.func if isinstance(dec, ast.Call) else dec
        if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == "njit":
            return dec
    return None


def _options(dec):
    """The names unpacked into an ``@njit(...)`` call (``**JIT`` -> {"JIT"})."""
    if not isinstance(dec, ast.Call):
        return set()
    return {k.value.id for k in dec.keywords if k.arg is None and isinstance(k.value, ast.Name)}


def kernels(sources):
    """{path: [(name, options, line)]} of the ``@njit`` functions in {path: source}."""
    found = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and _jit_decorator(node) is not None:
                found.setdefault(path, []).append((node.name, _options(_jit_decorator(node)), node.lineno))
    return found


class _References(ast.NodeVisitor):
    """Names and attributes in ``names`` read outside any ``@njit`` function's body."""

    def __init__(self, path, names):
        self.path, self.names, self.inside, self.hits = path, names, 0, []

    def visit_FunctionDef(self, node):
        for dec in node.decorator_list:
            self.visit(dec)
        jit = _jit_decorator(node) is not None
        self.inside += jit
        for stmt in node.body:
            self.visit(stmt)
        self.inside -= jit

    def _hit(self, name, node):
        if not self.inside and name in self.names:
            self.hits.append(f"{self.path}:{node.lineno}: {name}")

    def visit_Name(self, node):
        self._hit(node.id, node)

    def visit_Attribute(self, node):
        self._hit(node.attr, node)
        self.generic_visit(node)


def callee_references(sources):
    """Every place outside a kernel that names a JIT_CALLEE kernel, as "path:line: name"."""
    callees = {name for found in kernels(sources).values() for name, options, _ in found
               if options & CALLEE_OPTIONS}
    hits = []
    for path, text in sources.items():
        visitor = _References(path, callees)
        visitor.visit(ast.parse(text))
        hits += visitor.hits
    return hits


def _sources(roots):
    return {str(p.relative_to(ROOT)): p.read_text() for root in roots for p in sorted((ROOT / root).rglob("*.py"))}


def test_every_kernel_takes_the_shared_options():
    loose = [f"{path}:{line}: {name}" for path, found in kernels(_sources(PACKAGES)).items()
             for name, options, line in found if not options & KERNEL_OPTIONS]
    assert loose == []


def test_no_code_outside_a_kernel_names_a_callee_kernel():
    found = kernels(_sources(PACKAGES))
    assert sum(1 for items in found.values() for _, options, _ in items if options & CALLEE_OPTIONS) > 20
    assert callee_references(_sources(READERS)) == []


def test_the_check_finds_a_python_call_of_a_callee():
    source = (
        "@njit(**JIT_CALLEE)\n"
        "def inner(a):\n"
        "    return a\n"
        "@njit(**JIT)\n"
        "def outer(a):\n"
        "    return inner(a)\n"
        "def python_side(a):\n"
        "    return outer(a) + inner(a)\n"
        "ref = K.inner\n")
    assert callee_references({"m.py": source}) == ["m.py:8: inner", "m.py:9: inner"]
