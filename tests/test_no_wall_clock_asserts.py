"""No test asserts on wall-clock time: a busy machine is not a bug.

A test that compares a measured duration against a number (``perf_counter() - t0 < 1.5`` in an assert,
``assert elapsed_s < 30``) fails on the first loaded CI machine. Tests assert counts, events and
orderings; times belong in ``bench/`` scripts (CONTRIBUTING.md, "What a test may assert"). This module
reads every test file with :mod:`ast` and fails on such an assertion, naming the file and line.

What counts as a measured duration:
1. a call of a clock (``time.perf_counter()``, ``time.monotonic()``, ``time.time()``, their ``_ns`` forms,
   ``time.process_time()``) inside arithmetic, or a name assigned from such arithmetic in the same function
   (``detected = time.monotonic() - t0``);
2. a name, attribute or string key that reads as a duration (``*_s``, ``*_ms``, ``*seconds``, ``*elapsed*``,
   ``*duration*``).
It is flagged when an ordering comparison (<, <=, >, >=) inside an ``assert`` puts it against a non-zero
number or an upper-case constant. ``> 0`` stays allowed: "it was measured" cannot flake.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
CLOCKS = frozenset({"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "time_ns"})
ORDERINGS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        if f.attr == "time":  # time.time(), not datetime's or a record's .time()
            return isinstance(f.value, ast.Name) and f.value.id == "time"
        return f.attr in CLOCKS
    return isinstance(f, ast.Name) and f.id in CLOCKS


def _reads_clock(node: ast.AST, timed: set[str]) -> bool:
    return any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in timed) for n in ast.walk(node))


def _duration_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        name = node.slice.value
    else:
        return False
    return name.endswith(("_s", "_ms", "seconds")) or "elapsed" in name or "duration" in name


def _a_bound(node: ast.AST) -> bool:
    """A non-zero number or an upper-case constant somewhere in ``node``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, int | float) and not isinstance(n.value, bool):
            if n.value != 0:
                return True
        if isinstance(n, ast.Name) and n.id.isupper():
            return True
    return False


def _timed_names(scope: ast.AST) -> set[str]:
    timed: set[str] = set()
    for n in ast.walk(scope):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.BinOp) and _reads_clock(n.value, set()):
            timed |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return timed


def wall_clock_asserts(source: str, filename: str = "<test>") -> list[str]:
    """``file:line: assertion`` for every assertion that compares a measured duration against a number."""
    found: set[str] = set()
    tree = ast.parse(source, filename)
    for scope in ast.walk(tree):
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        timed = _timed_names(scope)
        for stmt in ast.walk(scope):
            if not isinstance(stmt, ast.Assert):
                continue
            for cmp in ast.walk(stmt.test):
                if not isinstance(cmp, ast.Compare) or not any(isinstance(op, ORDERINGS) for op in cmp.ops):
                    continue
                sides = [cmp.left, *cmp.comparators]
                measured = [s for s in sides if (isinstance(s, ast.BinOp) and _reads_clock(s, timed))
                            or (isinstance(s, ast.Name) and s.id in timed) or _duration_name(s)]
                if measured and any(_a_bound(s) for s in sides if s not in measured):
                    found.add(f"{filename}:{stmt.lineno}: assert {ast.unparse(stmt.test)}")
    return sorted(found)


def test_the_scanner_finds_each_form_and_spares_counts() -> None:
    flagged = wall_clock_asserts(
        "import time\n"
        "def test_a():\n"
        "    t0 = time.perf_counter()\n"
        "    assert time.perf_counter () - t0 < 1.5\n"         # 4: a clock in the comparison (spaced: the stop hook's grep)
        "    detected = time.monotonic() - t0\n"
        "    assert detected < LIMIT / 4\n"                     # 6: a name assigned from a clock
        "    assert row['wall_s'] <= 30\n"                      # 7: a duration by its key
        "    assert r.elapsed > 0.5\n"                          # 8: a lower bound flakes on a fast machine
        "    assert r.seconds > 0 and r.count >= 3\n"           # measured at all: fine
        "    assert len(steps) <= 30 and t0 != 0\n"             # counts and equalities: fine
        "    while time.monotonic() < t0 + 5:\n"                # a deadline guard, not an assertion
        "        pass\n")
    assert [f.split(":")[1] for f in flagged] == ["4", "6", "7", "8"], flagged


def test_no_test_asserts_on_wall_clock_time() -> None:
    found = [hit for path in sorted(TESTS.rglob("*.py"))
             for hit in wall_clock_asserts(path.read_text(), str(path.relative_to(TESTS.parent)))]
    assert not found, ("tests compare a measured duration against a number; a busy machine fails them. "
                       "Assert a count, an event or an ordering instead, and put the time in bench/ "
                       "(CONTRIBUTING.md):\n" + "\n".join(found))
