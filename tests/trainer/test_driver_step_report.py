"""The typed step report and its one flattening into a ``metrics.jsonl`` line (the keys readers use)."""

import json
import math
import sys
from pathlib import Path

from asyncrl.trainer.actor.reports import TrainStepMetrics
from asyncrl.trainer.correction.stats import DERIVED, CorrectionStats
from asyncrl.trainer.driver.run.rundir import RunDir
from asyncrl.trainer.driver.run.step_report import ActorStep, WeightSync, step_line
from asyncrl.trainer.oldlogits.audit import AuditStats

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from tests.support.step_reports import step_report  # noqa: E402

# The keys of an applied step's line that docs, bench/ and tests read (docs/metrics.md, docs/weight-sync.md,
# bench/old_logits.py, bench/paper, rundir's report plot, the status reporter's tests before it was typed).
READ_KEYS = {
    "step", "version", "applied", "wall_s", "reward_mean", "success_rate", "staleness_mean", "staleness_max",
    "trajectories", "partial_frac", "step_s", "env_errors", "loss", "grad_norm", "reference", "ewma_reset",
    "ewma_reset_reason", "actor_forward_s", "actor_reference_s", "actor_backward_s", "actor_audit_s",
    "snapshot_resident_versions", "snapshot_resident_bytes", "updates", "updates_applied", "updates_skipped",
    "micro_batches", "loss_last", "grad_norm_last", "in_bounds_ratio", "weights_publish_s", "sync_s",
    "sync_transfer_s", "sync_pause_s", "sync_bytes", "dedicated_wait_s", "checkpoint", "export", "export_s",
    "keep_ratio", "clip_low_frac", "clip_high_frac", "valid_tokens", "kept_tokens", "rd_min", "rd_max",
}


def test_an_applied_step_is_one_flat_line_with_the_keys_readers_use() -> None:
    sync = WeightSync(0.123456, transfer_seconds=0.1, pause_seconds=0.02, bytes=4096.0)
    report = step_report(3, valid=200, keep=0.75, staleness=2, sync=sync, checkpoint="/c/step-000003",
                         export="/c/exports/step-000003", export_s=0.5, dedicated_wait_s=0.25)
    line = step_line(report)
    assert READ_KEYS <= set(line), READ_KEYS - set(line)
    assert (line["applied"], line["version"], line["step"]) == (True, 3, 3)
    # CorrectionStats.record(): every count under its own name and the derived fractions beside them
    record = report.actor.metrics.correction.record()
    assert {k: line[k] for k in record} == record
    assert set(CorrectionStats.__dataclass_fields__) | {d.name for d in DERIVED} <= set(line)
    assert line["keep_ratio"] == 0.75  # 150 kept of 200
    assert (line["sync_s"], line["sync_bytes"]) == (0.1235, 4096.0)  # seconds rounded to 0.1 ms, once, here
    assert line["dedicated_wait_s"] == 0.25 and "batch_summary" not in line and "audit_tokens" not in line
    json.dumps(line)  # plain JSON types only (non-finite floats are the run directory's to write)


def test_a_step_not_applied_has_no_version_and_carries_its_batch() -> None:
    line = step_line(step_report(4, applied=False))
    assert line["applied"] is False and "version" not in line
    assert line["batch_summary"] == {"rows": 8.0}
    assert not {"sync_s", "checkpoint", "export", "weights_publish_s"} & set(line)


def test_interrupt_sync_phases_and_the_audit_are_flattened_by_their_own_names() -> None:
    audit = AuditStats(tokens=10, rows=2, rows_unscorable=0, abs_diff_mean=0.01, abs_diff_p99=0.05,
                       mask_disagree_tokens=1, clip_disagree_tokens=2)
    report = step_report(2, sync=WeightSync(1.0, pause_seconds=1.0, phases={"interrupt": 0.1, "score": 0.6}))
    metrics: TrainStepMetrics = report.actor.metrics
    line = step_line(report.with_(actor=ActorStep(metrics.__class__(**{**vars(metrics), "audit": audit}))))
    assert (line["sync_interrupt_s"], line["sync_score_s"], line["sync_pause_s"]) == (0.1, 0.6, 1.0)
    assert "sync_transfer_s" not in line  # no worker answered: the part is absent, not 0
    assert line["audit_tokens"] == 10.0 and line["audit_clip_disagree"] == 0.2


def test_the_run_directory_reads_back_what_the_line_wrote(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run")
    report = step_report(1, applied=True)
    bad = report.with_(actor=ActorStep(TrainStepMetrics(**{**vars(report.actor.metrics), "loss": math.nan})))
    run.append_step(step_line(bad))
    (back,) = run.read_steps()
    assert back["version"] == 1 and back["applied"] is True and back["loss"] == "nan"  # JSON has no NaN
