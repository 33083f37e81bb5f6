"""examples/dataset.yaml end to end, as a user runs it (slow): `asyncrl run examples/dataset.yaml --steps 2`
from the repository root, in a process of its own. The relative dataset path and pythonPath resolve from
there in every Ray worker, the reward function is the user's file, and the held-out rows are evaluated."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

pytestmark = [pytest.mark.slow]


def test_the_dataset_example_runs_two_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # pythonPath alone must find my_reward
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("asyncrl")), "run", "examples/dataset.yaml", "--steps", "2",
         "--run-dir", str(run_dir), "--port", "0", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["final_version"] == 2, summary.get("error")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "version" in r]
    assert len(steps) == 2 and all(math.isfinite(r["loss"]) for r in steps)
    # rewards come from examples/tasks/my_reward.py (in [0, 1]; an answer cut off by maxNewTokens gets 0)
    assert all(0.0 <= r["reward_mean"] <= 1.0 and 0.0 <= r["success_rate"] <= 1.0 for r in steps)
    evals = [r for r in records if "eval_version" in r]
    assert [r["eval_version"] for r in evals] == [0, 2]  # everySteps 10: at the start and at the last version
    assert all(r["eval_prompts"] == 10 for r in evals)  # 10 of the 13 held-out capitals


def test_a_resumed_dataset_job_trains_no_row_twice(ray_session: None, tmp_path: Path) -> None:
    """Two steps with a checkpoint, then a resumed run to four, on 400 rows (one epoch: rollout runs at
    most a few dozen groups ahead), so a replayed prompt would repeat a row: every trained group's row
    and every (worker, group index) is distinct, and the resumed groups come after the saved cursors."""
    import yaml

    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Capital of country {i}?", "answer": f"city {i}"}) + "\n"
                            for i in range(400)))
    doc = yaml.safe_load((ROOT / "examples" / "dataset.yaml").read_text())
    doc["spec"]["task"]["dataset"]["path"] = str(data)
    doc["spec"]["task"]["pythonPath"] = [str(ROOT / "examples" / "tasks")]
    doc["spec"]["checkpoint"] = {"everySteps": 2}
    doc["spec"]["eval"] = {"everySteps": 0}
    job = validate_job(doc)
    groups: list[list[tuple[str, str]]] = [[], []]  # (group id "w<i>-g<k>", row id) of every trained group
    summaries = []
    for attempt, steps in enumerate((2, 4)):
        def keep(batch, version, attempt=attempt) -> None:
            groups[attempt].extend((g[0].group_id, g[0].info["id"]) for g in batch)

        result = run_job(job, RunOptions(run_dir=tmp_path / "run", steps=steps, port=0), on_batch=keep)
        assert result.summary.status == "succeeded" and result.summary.totals.final_version == steps
        summaries.append(result.summary.to_json())
    cursors = summaries[1]["resume"]["cursors"]  # each worker's cursor at the checkpoint of version 2
    assert len(groups[0]) == 2 * 8 and len(groups[1]) == 2 * 8
    trained = groups[0] + groups[1]
    rows = [r for _, r in trained]
    assert len(set(rows)) == len(rows), [r for r in rows if rows.count(r) > 1]
    assert len({g for g, _ in trained}) == len(trained)
    for gid, _ in groups[1]:  # the resumed run only trains groups started after the checkpoint
        w, k = gid.removeprefix("w").split("-g")
        assert int(k) >= cursors[int(w)], (gid, cursors)
