"""The customer-service experiment's control arms and records (bench/customer_service.py and
bench/customer_service_controls.py): the budget matching, the rate choice, the transcript cap, the report over
arms, and the shuffled control's job. The arms' runs themselves are the bench's (minutes to hours), not a test's."""

import pytest

from tests.support.helpers import bench_module

C = bench_module("customer_service_controls")
B = bench_module("customer_service")


def test_a_budget_is_spent_by_samples_or_by_time() -> None:
    rl = {"train_seconds": 80.0}
    by_samples = C.rl_budget(rl, 6144, "samples")  # RL's 48 steps x 8 prompts x 16
    assert by_samples.spent(1536, 500.0) == 0.25 and by_samples.spent(6144, 1.0) == 1.0  # time does not count
    by_time = C.rl_budget(rl, 6144, "time")
    assert by_time.spent(10**6, 20.0) == 0.25 and by_time.spent(0, 80.0) == 1.0  # samples do not count


def test_the_rate_is_the_best_on_validation_and_a_tie_goes_low() -> None:
    assert C.best_rate({1e-4: 0.1, 3e-4: 0.4, 1e-3: 0.3}) == 3e-4
    assert C.best_rate({1e-3: 0.5, 3e-4: 0.5, 3e-3: 0.2}) == 3e-4
    with pytest.raises(ValueError, match="no rate"):
        C.best_rate({})


def test_an_arm_stops_at_each_fraction_of_its_budget() -> None:
    class Host:  # the Ray handle's shape: .supervised.remote / .weights.remote, resolved by ray.get
        pass

    import ray

    seen: list[tuple[int, float, int]] = []
    arm = C.Arm("t", Host(), lambda: ([], 100), 1e-3)  # every round generates 100 samples, none successful
    orig = ray.get
    try:
        ray.get = lambda ref: ref  # type: ignore[assignment]
        Host.weights = type("W", (), {"remote": staticmethod(lambda: {"w": 1})})  # type: ignore[attr-defined]
        out = arm.run(C.Budget(400, 1e9, "samples"), [0.5, 1.0],
                      lambda k, f, sec, o: seen.append((k, f, o["samples"])))
    finally:
        ray.get = orig
    assert seen == [(1, 0.5, 200), (2, 1.0, 400)] and out["samples"] == 400 and out["empty_rounds"] == 4
    assert out["sft_steps"] == 0 and out["loss_first"] is None


def test_a_transcript_is_capped() -> None:
    short = B.transcript("abc", True, "goal reached")
    assert short == {"success": True, "end": "goal reached", "text": "abc"}
    long = B.transcript("x" * 5000, False, "wrong action: cancel")["text"]
    assert long.startswith("x" * B.TRANSCRIPT_CHARS) and long.endswith(f"... [{5000 - B.TRANSCRIPT_CHARS} more chars]")


def test_the_shuffled_control_is_the_rl_job_with_the_knob() -> None:
    from asyncrl.api.validation import validate_job

    spec = validate_job(B.job_doc(B.FULL, 0, {"shuffle_rewards": B.FULL.shuffle_window})).spec
    assert spec.task.args == {"shuffle_rewards": 512} and spec.task.name == "customer-service"
    assert "args" not in B.job_doc(B.FULL, 0)["spec"]["task"]


def _record(kind: str, seed: int, p1: float) -> dict:  # type: ignore[type-arg]
    flags = {"looked_up": 1.0, "copied_user": 0.5}
    pts = [{"fraction": f, "pass_k": {str(k): p1 * f for k in (1, 2, 3, 4)}, "behaviour": flags} for f in (0.0, 1.0)]
    return {"kind": kind, "seed": seed, "points": pts}


def test_the_report_covers_every_arm_and_tests_rl_against_each(tmp_path) -> None:
    import json

    for seed in (0, 1, 2):
        for kind, p1 in (("rl", 0.30 + 0.01 * seed), ("rft", 0.20), ("sft_success", 0.90)):
            (tmp_path / f"{kind}-s{seed}.json").write_text(json.dumps(_record(kind, seed, p1)))
    runs = B.load(tmp_path)
    assert list(runs)[0] == "rl" and set(runs) == {"rl", "rft", "sft_success"}
    text = B.report(runs, None)
    assert "pass^1 rl | pass^1 rft | pass^1 sft_success" in text
    assert "RL - rft" in text and "RL - sft_success" in text and "| rl | 1.00 -> 1.00 | 0.50 -> 0.50 |" in text
    (tmp_path / "rft-s2.json").unlink()
    with pytest.raises(SystemExit, match="rft seeds"):
        B.load(tmp_path)
