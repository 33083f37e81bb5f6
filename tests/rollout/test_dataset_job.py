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
