"""The run directory: step log, summary and the PNG report."""

import json

from asyncrl.trainer.driver.run.rundir import RunDir, write_report


def test_steps_summary_and_report(tmp_path):
    run = RunDir.create(tmp_path / "run")
    for step in range(1, 6):
        run.append_step({
            "step": step, "reward_mean": step / 5, "success_rate": step / 5, "keep_ratio": 1.0,
            "clip_low_frac": 0.01, "clip_high_frac": 0.02, "staleness_mean": 0.5, "staleness_max": 1,
            "ewma_reset": int(step == 3), "loss": float("nan") if step == 4 else 0.1,
        })
    steps = run.read_steps()
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert steps[3]["loss"] == "nan"  # the file stays valid JSON
    run.write_summary({"final_success": 1.0})
    assert json.loads(run.summary_json.read_text()) == {"final_success": 1.0}
    png = write_report(steps, run.report_png, "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run.checkpoint_dir("checkpoints") == run.path / "checkpoints"


def test_report_of_an_empty_run_is_still_written(tmp_path):
    run = RunDir.create(tmp_path)
    assert write_report(run.read_steps(), run.report_png).exists()


def test_resume_drops_steps_logged_after_the_checkpoint(tmp_path):
    run = RunDir.create(tmp_path)
    for step in range(1, 8):
        run.append_step({"step": step})
    kept = run.keep_steps_up_to(5)
    assert [s["step"] for s in kept] == [1, 2, 3, 4, 5]
    assert [s["step"] for s in run.read_steps()] == [1, 2, 3, 4, 5]
