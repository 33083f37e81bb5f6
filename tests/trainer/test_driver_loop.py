"""Pure helpers of the loop: error reporting and the run summary."""

from ray.exceptions import RayTaskError

from asyncrl.rollout.engine import RolloutError
from asyncrl.trainer.driver.loop.accounting import summarise
from asyncrl.trainer.driver.loop.training_loop import _cause


def test_worker_errors_are_reported_with_task_and_trajectories():
    err = RolloutError("environment raised ZeroDivisionError", task="calculator", traj_ids=["w0-g3-s1"])
    wrapped = RayTaskError("RolloutHost.generate", "Traceback (most recent call last): ...", err)
    msg = _cause(wrapped)
    assert msg.startswith("RolloutError: environment raised ZeroDivisionError")
    assert "task calculator" in msg and "w0-g3-s1" in msg and "Traceback" not in msg


def test_summary_averages_the_first_and_last_window():
    records = [{"step": i, "version": i, "applied": True, "success_rate": i / 20, "reward_mean": i / 20} for i in range(1, 21)]
    s = summarise(records, wall_s=12.345, window=10)
    # first 10: mean(1..10)/20 = 5.5/20 = 0.275; last 10: mean(11..20)/20 = 15.5/20 = 0.775
    assert (s.start_success, s.final_success) == (0.275, 0.775)
    assert s.steps_done == 20 and s.final_version == 20 and s.wall_s == 12.35
    assert summarise([], 1.0).final_success is None
