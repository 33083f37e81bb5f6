import threading
import time
from collections.abc import Callable

import pytest
import torch

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.engine import RolloutError
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.math_tasks import MathTurn
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.trajectory import TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker

Weights = Callable[[int], dict[str, torch.Tensor]]
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")


def worker(weights: Weights, index: int = 0, seed: int = 0, **task: object) -> RolloutWorker:
    spec = TaskSpec(**{"name": "calculator", "group_size": 4, "max_new_tokens": 24, **task})  # type: ignore[arg-type]
    w = RolloutWorker(spec, MODEL, AsyncSpec(), worker_index=index, seed=seed)
    w.load_weights(weights(0), version=0)
    return w


def test_generate_groups(weights: Weights) -> None:
    w = worker(weights)
    trajs = w.generate(3)
    assert len(trajs) == 3 * 4 and len({t.traj_id for t in trajs}) == 12
    groups: dict[str, list[str]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(TOKENIZER.decode(t.tokens[: t.prompt_len]))
        assert t.task == "calculator" and set(t.sampled_versions) == {0}
        assert t.status in (TrajectoryStatus.FINISHED, TrajectoryStatus.TRUNCATED)
    assert len(groups) == 3 and all(
        len(set(p)) == 1 and len(p) == 4 for p in groups.values()
    )  # one prompt per group
    s = w.stats()
    assert s.trajectories_finished + s.trajectories_truncated == 12 and s.groups_started == 3
    assert s.tokens_sampled == sum(sum(t.loss_mask) for t in trajs) and s.busy_seconds > 0
    assert w.generate(1)[0].group_id == "w0-g3"


def test_workers_are_seeded(weights: Weights) -> None:
    a, b, c = worker(weights), worker(weights), worker(weights, index=1)
    ta, tb, tc = a.generate(2), b.generate(2), c.generate(2)
    assert [t.tokens for t in ta] == [t.tokens for t in tb]
    assert [t.tokens[: t.prompt_len] for t in ta] != [t.tokens[: t.prompt_len] for t in tc]


def test_environment_errors_abort_their_episodes_only_and_name_the_error(
    weights: Weights, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = worker(weights)

    def broken(self: MathTurn, sample: dict[str, object]) -> None:
        raise ZeroDivisionError("tool crashed")

    monkeypatch.setattr(MathTurn, "reset", broken)
    out = w.generate(1)  # no exception: user code never takes the worker down
    assert [t.traj_id for t in out] == [f"w0-g0-s{j}" for j in range(4)]
    assert all(t.status is TrajectoryStatus.ABORTED and t.info["env_error"] == "exception" for t in out)
    assert "MathTurn.reset raised ZeroDivisionError: tool crashed" in out[0].info["end_reason"]
    assert w.stats().trajectories_aborted == 4 == w.env_errors()["exception"]
    monkeypatch.undo()
    assert all(t.status is not TrajectoryStatus.ABORTED for t in w.generate(1))  # the next group is fine


def test_generate_needs_weights() -> None:
    w = RolloutWorker(TaskSpec(), MODEL, AsyncSpec())
    assert w.version == -1
    with pytest.raises(RolloutError, match="load_weights"):
        w.generate(1)


def test_interrupted_episodes_resume_in_the_next_call(
    weights: Weights, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = worker(weights, max_new_tokens=40)
    started = threading.Event()
    step = TurnAdapter.end_of_turn  # called after every sampled token

    def slow(self: TurnAdapter, turn_text: str) -> object:
        started.set()
        w.engine._interrupt_req.wait(60)  # no episode ends before the interrupt is asked for, however late it comes
        time.sleep(0.002)
        return step(self, turn_text)

    monkeypatch.setattr(TurnAdapter, "end_of_turn", slow)
    out: list[object] = []
    th = threading.Thread(target=lambda: out.extend(w.generate(2)))
    th.start()
    assert started.wait(10)
    snaps = w.interrupt(timeout_s=10)
    th.join(10)
    assert snaps and all(s.status is TrajectoryStatus.INTERRUPTED for s in snaps)
    assert len(out) + len(snaps) == 8 and w.suspended == len(snaps)
    monkeypatch.setattr(TurnAdapter, "end_of_turn", step)
    w.update_weights(weights(1), version=1)
    rest = w.generate(0)  # resumes the suspended episodes only
    assert sorted(t.traj_id for t in rest) == sorted(s.traj_id for s in snaps)
    assert w.suspended == 0 and w.stats().trajectories_interrupted == len(snaps)
    # a dropped suspended episode is counted, never lost silently
    th = threading.Thread(target=lambda: w.generate(1))
    monkeypatch.setattr(TurnAdapter, "end_of_turn", slow)
    started.clear()
    th.start()
    assert started.wait(10)
    snaps = w.interrupt(timeout_s=10)
    th.join(10)
    aborted = w.abort_suspended()
    assert [t.traj_id for t in aborted] == [s.traj_id for s in snaps]
    assert all(
        t.status is TrajectoryStatus.ABORTED for t in aborted
    ) and w.stats().trajectories_aborted == len(snaps)


def test_engine_choice_is_validated() -> None:
    from asyncrl.api.pods import RolloutSpec

    # vllm is a real engine now (tests/rollout/test_vllm*.py); a name the spec pattern would refuse is
    # refused by the worker too (defence in depth), with the valid names
    with pytest.raises(ValueError, match="spec.rollout.engine 'tgi' is unknown; valid engines: transformers, vllm"):
        RolloutWorker(TaskSpec(), MODEL, AsyncSpec(), rollout=RolloutSpec().model_copy(update={"engine": "tgi"}))
    with pytest.raises(
        ValueError, match=r"engineArgs \{'gpu_memory_utilization': 0.5\} do not fit.*fp32Head"
    ):  # the spec refuses these too; the engine's own check names the arguments it takes
        RolloutWorker(
            TaskSpec(), MODEL, AsyncSpec(),
            rollout=RolloutSpec().model_copy(update={"engine_args": {"gpu_memory_utilization": 0.5}}),
        )
    w = RolloutWorker(TaskSpec(), MODEL, AsyncSpec(), rollout=RolloutSpec(engine_args={"fp32Head": True}))
    assert w.engine.fp32_head  # type: ignore[attr-defined]


def test_prompt_cursor_continues_a_run_without_replaying_prompts(weights: Weights) -> None:
    first = worker(weights)
    before = first.generate(2)  # groups g0, g1
    assert first.prompt_cursor == 2
    after = first.generate(1)  # group g2: what a run that never stopped samples next
    resumed = worker(weights)  # a new process after a restart
    assert resumed.prompt_cursor == 0
    resumed.set_prompt_cursor(2)
    again = resumed.generate(1)
    prompts = [tuple(t.tokens[: t.prompt_len]) for t in again]
    assert [t.group_id for t in again] == [t.group_id for t in after] == ["w0-g2"] * 4
    assert prompts == [tuple(t.tokens[: t.prompt_len]) for t in after]  # the very next prompts
    assert not set(prompts) & {tuple(t.tokens[: t.prompt_len]) for t in before}
    assert resumed.prompt_cursor == 3 and resumed.stats().groups_started == 1  # this process's count


def test_set_prompt_cursor_refuses_bad_values_and_suspended_episodes(weights: Weights) -> None:
    w = worker(weights)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"n must be an int >= 0, got {bad!r}"):
            w.set_prompt_cursor(bad)  # type: ignore[arg-type]
    w._suspended = w._new_group()  # as an interrupt leaves them
    with pytest.raises(RuntimeError, match="4 episodes are suspended; call abort_suspended"):
        w.set_prompt_cursor(0)
    w.abort_suspended()
    w.set_prompt_cursor(0)
    assert w.prompt_cursor == 0


def test_evaluate_poses_the_given_problems_under_one_version_and_leaves_training_alone(weights: Weights) -> None:
    from asyncrl.rollout.envs.registry import get_task

    w = worker(weights)
    w.generate(1)
    before = w.stats()
    problems = get_task("calculator").heldout_problems(6, seed=0)
    out = w.evaluate(problems, version=0, temperature=1e-3, seed=5, first=10)
    assert [t.traj_id for t in out] == [f"eval-v0-p{k}" for k in range(10, 16)]
    assert [t.info["question"] for t in out] == [p.question for p in problems]
    assert all(set(t.sampled_versions) == {0} and t.status is not TrajectoryStatus.INTERRUPTED for t in out)
    # seeded and (near) greedy: the same answers again, and the training stream is untouched
    assert [t.tokens for t in w.evaluate(problems, version=0, temperature=1e-3, seed=5)] == [t.tokens for t in out]
    after = w.stats()
    assert w.prompt_cursor == 1 and after.groups_started == before.groups_started
    assert (after.tokens_sampled, after.trajectories_finished + after.trajectories_truncated) == (
        before.tokens_sampled, before.trajectories_finished + before.trajectories_truncated)
    assert after.eval_trajectories == 12 and after.eval_seconds > 0
    # the next training group is the one a worker that never evaluated draws
    plain = worker(weights)
    plain.generate(1)
    assert [t.tokens[: t.prompt_len] for t in w.generate(1)] == [t.tokens[: t.prompt_len] for t in plain.generate(1)]
    with pytest.raises(RuntimeError, match="holds version 0, the evaluation is of version 3"):
        w.evaluate(problems, version=3, temperature=1.0, seed=0)
