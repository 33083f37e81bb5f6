"""bench/step_path.py: its accounting on a hand-driven clock and hand-made rounds (fast), and the whole bench
with one tree twice, the A/A form (slow). No timing is asserted: the machine is shared."""

import math
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT, bench_module

BENCH = ROOT / "bench" / "step_path.py"




bench = bench_module("step_path")


def test_stage_clock_counts_a_nested_stage_only_in_the_inner_one() -> None:
    now = [0.0]

    def advance(dt: float) -> None:
        now[0] += dt

    clock = bench.StageClock(clock=lambda: now[0])
    inner = clock.wrap("inner", lambda: advance(2.0))

    def outer_body() -> None:
        advance(1.0)
        inner()
        advance(2.0)

    outer = clock.wrap("outer", outer_body)
    outer()  # 5 s in all, 2 of them inside inner: outer 1 + 2 = 3 of its own
    inner()  # inner alone: 2 more
    assert clock.take() == {"outer": 3.0, "inner": 4.0}
    assert clock.take() == {}  # take() empties


def test_stage_clock_counts_a_call_that_raises() -> None:
    now = [0.0]

    def boom() -> None:
        now[0] += 1.5
        raise RuntimeError("x")

    clock = bench.StageClock(clock=lambda: now[0])
    with pytest.raises(RuntimeError):
        clock.wrap("s", boom)()
    assert clock.take() == {"s": 1.5}
    assert clock._stack == []  # the frame was closed


def test_ci_is_the_mean_and_the_t_half_width() -> None:
    mean, half = bench.ci([1.0, 2.0, 3.0])
    # sd([1, 2, 3]) = 1, n = 3: t(0.975, 2) = 4.30, half = 4.30 / sqrt(3) = 2.4826
    assert mean == 2.0
    assert half == pytest.approx(4.30 / math.sqrt(3), abs=1e-12)
    one, nan = bench.ci([5.0])
    assert one == 5.0 and math.isnan(nan)


def _steps(value: float, n: int = 3) -> list[dict[str, float]]:
    return [{k: value for k in (*bench.STAGES, "process")} for _ in range(n)]


def test_report_pairs_the_round_medians() -> None:
    # Round 1: b = 2 x a; round 2: b = a. Ratios 2 and 1: mean 1.5, sd 0.7071, n = 2:
    # half = 12.71 * 0.7071 / sqrt(2) = 6.355. Medians over every step: a 0.1 s = 100.0 ms; b the median of
    # [0.2, 0.2, 0.2, 0.1, 0.1, 0.1] = 0.15 s = 150.0 ms.
    rounds = [{"a": _steps(0.1), "b": _steps(0.2)}, {"a": _steps(0.1), "b": _steps(0.1)}]
    table = bench.report(["a", "b"], rounds)
    step_row = next(line for line in table.splitlines() if line.startswith("step "))
    assert step_row.split() == ["step", "100.0", "150.0", "1.500", "+-6.355"]
    rows = {line.split()[0] for line in table.splitlines()[2:]}
    assert rows == {*bench.STAGES, "process"}


@pytest.mark.slow
def test_the_bench_runs_one_tree_against_itself() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--version", "a=", "--version", "b=", "--rounds", "2", "--steps", "1",
         "--warmup", "0", "--batches", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == [*bench.STAGES, "process"]
    step = next(r for r in rows if r[0] == "step")
    assert float(step[1]) > 0 and float(step[2]) > 0 and float(step[3]) > 0  # ms per step, both; their ratio
