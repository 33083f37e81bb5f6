"""bench/old_logits.py: its arithmetic on hand-made step records. The whole bench in its ``--quick`` form (one
row per strategy at W=1 with every column, the targets block, and the exact strategies' r_d at 1) runs once,
through ``bench/paper/system_cost.py``, in ``tests/trainer/test_bench_paper.py``'s quick test (it ran twice
before). No timing is asserted: the machine is shared."""

from typing import Any

import pytest

from tests.support.helpers import bench_module

bench = bench_module("old_logits")
WEIGHTS = 1000  # bytes of one weight copy in these hand-made runs


def _records(walls: list[float], steps: list[float], refs: list[float], **extra: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, (w, s, r) in enumerate(zip(walls, steps, refs, strict=True)):
        rec = {"step": i + 1, "version": i + 1, "wall_s": w, "step_s": s, "actor_reference_s": r,
               "actor_forward_s": 0.1, "sync_s": 0.01, "rd_min": 1.0, "rd_max": 1.0, "staleness_max": 1, "partial_frac": 0.0}
        rec.update({k: v[i] for k, v in extra.items()})
        out.append(rec)
    return out


def _rows(snapshot_steps: list[float], ewma_steps: list[float], snapshot_ref: float = 0.2,
          ewma_ref: float = 0.1, ewma_bytes: int = WEIGHTS) -> list[Any]:
    base = bench.measure("behavior", 3, _records([10, 11, 12, 13], [1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]),
                         {}, WEIGHTS, WEIGHTS, 2)
    ewma = bench.measure("ewma", 3, _records([10, 11.5, 13, 14.5], ewma_steps, [ewma_ref] * 4), {}, WEIGHTS,
                         ewma_bytes, 2)
    snap = bench.measure("snapshot", 3, _records([10, 12, 13, 15], snapshot_steps, [snapshot_ref] * 4,
                                                 snapshot_resident_versions=[2, 4, 3, 3],
                                                 snapshot_resident_bytes=[2 * WEIGHTS, 4 * WEIGHTS, 3 * WEIGHTS, 3 * WEIGHTS]),
                         {}, WEIGHTS, WEIGHTS, 2)
    rows = [base, ewma, snap]
    bench.against_baseline(rows)
    return rows


def test_extras_are_medians_over_the_baseline_at_the_same_w() -> None:
    base, ewma, snap = _rows(snapshot_steps=[1.3, 1.3, 1.5, 1.3], ewma_steps=[1.2, 1.2, 1.2, 1.4])
    # per-step walls: baseline [1, 1, 1] -> 1; ewma [1.5, 1.5, 1.5] -> 1.5; snapshot [2, 1, 2] -> 2
    assert (base.extra_wall_s, ewma.extra_wall_s, snap.extra_wall_s) == (0.0, 0.5, 1.0)
    # step_s medians: ewma 1.2, snapshot 1.3 (baseline 1.0)
    assert ewma.extra_step_s == pytest.approx(0.2, abs=1e-12)
    assert snap.extra_step_s == pytest.approx(0.3, abs=1e-12)
    # resident versions (2 + 4 + 3 + 3) / 4 = 3, max 4; memory is the most bytes held at once
    assert (snap.resident_mean, snap.resident_max, snap.extra_memory_bytes) == (3.0, 4, 4 * WEIGHTS)
    assert (ewma.extra_memory_bytes, base.extra_memory_bytes) == (WEIGHTS, 0)


def test_targets_say_met_not_met_and_not_measured() -> None:
    # old-logit time in gradient forwards (0.1 s each): ewma 0.1 / 0.1 = 1, snapshot 0.2 / 0.1 = 2 -> 2.0x
    rows = _rows(snapshot_steps=[1.3] * 4, ewma_steps=[1.2] * 4)
    assert (rows[1].reference_forwards, rows[2].reference_forwards) == (pytest.approx(1.0), pytest.approx(2.0))
    by_name = {t.name.split(" (")[0]: t for t in bench.targets(rows, WEIGHTS, WEIGHTS)}
    assert by_name["snapshot old-logit time/step <= 2x ewma's"].met is True
    assert by_name["snapshot average resident versions < 5 at W=3"].met is True  # mean 3
    assert by_name["ewma holds exactly one extra weight copy"].met is True
    assert by_name["ewma one extra forward per step"].met is True

    # snapshot 0.25 / 0.1 = 2.5 forwards vs ewma's 1 -> 2.5x; ewma 0.16 / 0.1 = 1.6 forwards: more than one
    rows = _rows(snapshot_steps=[1.5] * 4, ewma_steps=[1.2] * 4, snapshot_ref=0.25)
    found = {t.name.split(" (")[0]: t for t in bench.targets(rows, WEIGHTS, 2 * WEIGHTS)}
    ratio = found["snapshot old-logit time/step <= 2x ewma's"]
    assert ratio.met is False and "2.50x" in ratio.detail
    assert found["ewma holds exactly one extra weight copy"].met is False  # two copies held
    rows = _rows(snapshot_steps=[1.5] * 4, ewma_steps=[1.2] * 4, ewma_ref=0.16)
    found = {t.name.split(" (")[0]: t for t in bench.targets(rows, WEIGHTS, WEIGHTS)}
    assert found["ewma one extra forward per step"].met is False

    rows = _rows(snapshot_steps=[1.3] * 4, ewma_steps=[1.0] * 4, ewma_ref=0.0)  # no ewma forward measured
    found = {t.name.split(" (")[0]: t for t in bench.targets(rows, WEIGHTS, WEIGHTS)}
    assert found["snapshot old-logit time/step <= 2x ewma's"].met is None


def test_arguments_name_the_bad_value_and_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--strategies", "ewma,snapshots"])
    err = capsys.readouterr().err
    assert "snapshots" in err and "interruptSync" in err
    args = bench.parse_args(["--strategies", "snapshot", "--ws", "3"])
    assert args.strategies == ["behavior", "snapshot"] and args.ws == [3]  # the baseline always runs


def test_dedicated_and_interrupt_sync_columns_come_from_their_summaries() -> None:
    # DedicatedStage.summary()["dedicated"]: two scorers (one dead at the end: it reports None).
    state = {"queued_host_bytes": 0, "advances": 4, "load_seconds": 3.2, "build_seconds": 3.0}
    summary = {"dedicated": {"wait_s": 0.9, "scorers": [state, None]}}
    recs = _records([10, 11, 12], [1.0] * 3, [0.0] * 3, dedicated_wait_s=[0.0, 0.3, 0.6])
    ded = bench.measure("dedicated", 2, recs, summary, WEIGHTS, WEIGHTS, 2)
    assert ded.extra_memory_bytes == 2 * WEIGHTS  # one model per scorer
    assert ded.switch_s == pytest.approx(0.05, abs=1e-12)  # (3.2 - 3.0 build) s over 4 advances
    assert (ded.stall_s, ded.stall_mean_s) == (0.3, pytest.approx(0.3, abs=1e-12))  # median; 0.9 s / 3 steps
    # interruptSync: the four phases of each step record; the median of their per-step sums
    phases = {f"sync_{p}_s": [0.1, 0.2, 0.3] for p in ("interrupt", "score", "update", "resume")}
    sync = bench.measure("interruptSync", 2, _records([10, 11, 12], [1.0] * 3, [0.0] * 3, **phases),
                         {"interrupt_sync": {"syncs": 3, "phase_s": {"score": 0.6}}}, WEIGHTS, WEIGHTS, 2)
    assert sync.stall_s == pytest.approx(0.8, abs=1e-12) and sync.stall_phases_s["score"] == pytest.approx(0.2)
    assert sync.extra_memory_bytes == 2 * WEIGHTS and sync.switch_s is None  # no scorer_load_s in the summary


@pytest.mark.parametrize(("reset", "copies"), [({}, 2.0), ({"rule": "paper"}, 1.0), ({"enabled": False}, 1.0)])
def test_the_ewma_memory_count_sees_the_recentre_residuals(reset: dict[str, Any], copies: float) -> None:
    # W = 2: theta_prox (1 copy) + the default recentre rule's 2 bf16 residuals (2 x 1/2 copy) = 2 copies; the
    # other rules keep theta_prox alone. Before, one unversioned update left the history empty: 1.000 x always.
    from asyncrl.api.validation import validate_job

    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "m"},
           "spec": {"correction": {"reference": "ewma", "ewma": {"reset": reset}}, "async": {"maxStaleness": 2},
                    "model": {"preset": "tiny-llama"}}}
    spec = validate_job(doc).spec
    assert bench.ewma_copies_expected(spec) == copies
    assert bench.ewma_held_bytes(spec) == copies * bench.weight_bytes_of(spec)
    found = {t.name: t for t in bench.targets([], 1000, int(copies * 1000), copies)}
    assert all(t.met for n, t in found.items() if n.startswith("ewma holds exactly"))
