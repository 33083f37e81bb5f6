"""A dataset job's rollout worker, for real (transformers engine, tiny random weights): a resumed
prompt cursor replays no row, and a reward service that fails aborts only its own episodes, each
counted by reason, while the worker goes on."""

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker
from tests.support.reward_server import RewardServer

MODEL = ModelSpec(hidden_size=32, ffn_hidden_size=64, num_layers=1, rollout_dtype="float32")
USERLAND = str(Path(__file__).parent / "userland")
GROUP = 2


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = [{"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(24)]
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def worker(data: Path, index: int = 0, workers: int = 2, **task: Any) -> RolloutWorker:
    spec = TaskSpec.model_validate({"dataset": {"path": str(data), "heldoutFraction": 0.0}, "groupSize": GROUP,
                                    "maxNewTokens": 3, **task})
    w = RolloutWorker(spec, MODEL, AsyncSpec(), worker_index=index, seed=0, workers=workers)
    w.load_weights({k: v.clone() for k, v in build_model(w.arch, seed=0).state_dict().items()}, version=0)
    return w


def group_rows(trajs: list[Any]) -> list[str]:
    """The row id of each group, in group order (every member of a group has the same row)."""
    by_group: dict[str, set[str]] = {}
    for t in trajs:
        by_group.setdefault(t.group_id, set()).add(t.info["id"])
    assert all(len(ids) == 1 for ids in by_group.values()), by_group
    return [next(iter(by_group[g])) for g in sorted(by_group, key=lambda g: int(g.rsplit("g", 1)[1]))]


def test_a_resumed_cursor_continues_the_rows_and_replays_none(data: Path) -> None:
    reward = {"reward": "dataset_reward:exact", "pythonPath": [USERLAND]}
    straight = group_rows(worker(data, **reward).generate(6))
    first = worker(data, **reward)
    before = group_rows(first.generate(3))
    cursor = first.prompt_cursor  # what the driver checkpoints
    resumed = worker(data, **reward)  # a new process after the restart
    resumed.set_prompt_cursor(cursor)
    after = group_rows(resumed.generate(3))
    assert before + after == straight  # the uninterrupted sequence
    assert len(set(before + after)) == 6  # 6 groups of worker 0 out of 24 rows: none twice
    other = group_rows(worker(data, index=1, **reward).generate(6))
    assert set(other).isdisjoint(straight)  # the other worker's positions interleave, never overlap


@pytest.mark.parametrize(("mode", "reason"), [("500", "remote_http_error"), ("down", "remote_unreachable"),
                                              ("garbage", "remote_bad_response")])
def test_a_failing_reward_service_aborts_its_episodes_only(data: Path, mode: str, reason: str) -> None:
    # A random model ends its turn (samples EOS) in some episodes within 64 tokens; the others are cut
    # off by maxNewTokens (TRUNCATED, reward 0, the service is not asked). The engine is seeded, so
    # which ones is the same every run.
    server = RewardServer("ok" if mode == "down" else mode)
    try:
        if mode == "down":
            server.stop()
        w = worker(data, maxNewTokens=64,
                   rewardService={"url": server.url, "retries": 1, "backoffSeconds": 0.01})
        first = w.generate(4)
        assert len(first) == 4 * GROUP  # nothing lost: every episode comes back
        scored = [t for t in first if t.status is not TrajectoryStatus.TRUNCATED]
        assert scored, "no episode ended its turn: raise maxNewTokens"
        assert all(t.status is TrajectoryStatus.ABORTED and t.info["env_error"] == reason for t in scored)
        assert w.env_errors()[reason] == len(scored) and w.stats().env_errors == len(scored)
        assert w.stats().trajectories_aborted == len(scored)
        if mode == "down":
            return
        server.mode = "ok"  # the service recovers: the same worker goes on
        later = w.generate(4)
        assert len(later) == 4 * GROUP and all(t.status is not TrajectoryStatus.ABORTED for t in later)
        assert any(t.status is TrajectoryStatus.FINISHED for t in later)
        assert w.env_errors()[reason] == len(scored)  # no new faults
    finally:
        if mode != "down":
            server.stop()


def test_an_environment_by_path_reads_the_dataset_rows(data: Path) -> None:
    spec = TaskSpec.model_validate({
        "dataset": {"path": str(data), "heldoutFraction": 0.25}, "environment": "dataset_env:RowEnv",
        "args": {"field": "prompt"}, "pythonPath": [USERLAND], "groupSize": GROUP, "maxNewTokens": 3,
    })
    w = RolloutWorker(spec, MODEL, AsyncSpec(), worker_index=0, seed=0, workers=1)
    w.load_weights({k: v.clone() for k, v in build_model(w.arch, seed=0).state_dict().items()}, version=0)
    samples = w.binding.samples
    train_prompts = {samples.dataset.rows[i]["prompt"] for i in samples.dataset.train}  # type: ignore[attr-defined]
    trajs = w.generate(4)
    assert len(trajs) == 4 * GROUP
    seen = {t.info["row_prompt"] for t in trajs}
    assert len(seen) == 4 and seen <= train_prompts  # training draws train rows only
    held = samples.heldout(3, seed=0)
    assert held and all(r["prompt"] not in train_prompts for r in held)
    evald = w.evaluate(held, version=0, temperature=1.0, seed=0)
    assert [t.info["row_prompt"] for t in evald] == [r["prompt"] for r in held]
