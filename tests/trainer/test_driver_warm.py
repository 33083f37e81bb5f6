"""The warm-start learning-rate schedule and its threads per actor rank."""

import pytest

from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr, warm_start_threads


def test_linear_warmup_then_cosine_to_a_tenth():
    total = 300  # warm-up 30 steps
    assert warm_start_lr(0, total) == pytest.approx(3e-3 / 30)  # 1/30 of the peak
    assert warm_start_lr(29, total) == pytest.approx(3e-3)  # peak at the end of warm-up
    assert warm_start_lr(30, total) == pytest.approx(3e-3)  # cosine starts at the peak
    # halfway through the decay: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55 of the peak
    assert warm_start_lr(30 + 269 // 2, total) == pytest.approx(0.55 * 3e-3, rel=1e-2)
    assert warm_start_lr(299, total) == pytest.approx(3e-4)  # ends at 10 %


def test_out_of_range_step():
    with pytest.raises(ValueError, match=r"step must be in \[0, 10\)"):
        warm_start_lr(10, 10)


def test_warm_start_threads_split_a_machine_between_its_ranks():
    assert warm_start_threads(2) == 2  # one rank (a plain handle): every core
    assert warm_start_threads(2, ["node-a"]) == 2
    assert warm_start_threads(2.0, ["node-a", "node-a"]) == 1  # DP=2 on 2 cores: 1 each, not 2 x 2
    assert warm_start_threads(8, ["pod-0", "pod-0", "pod-1", "pod-1"]) == 4  # 2 ranks per pod
    assert warm_start_threads(8, ["pod-0", "pod-1", "pod-1", "pod-1"]) == 2  # the fullest host decides
    assert warm_start_threads(2, ["node-a"] * 4) == 1  # more ranks than cores: never 0


def test_a_cluster_warm_start_splits_an_actor_pods_cpus_not_the_drivers():
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, _warm_threads

    class OneRank:  # HostHandles with a plain actor handle (one rank): only .actor is read
        actor = object()

    assert _warm_threads(OneRank(), RunOptions(num_cpus=64, actor_threads=6, placement="cluster")) == 6  # type: ignore[arg-type]
    assert _warm_threads(OneRank(), RunOptions(num_cpus=4, actor_threads=1)) == 4  # type: ignore[arg-type]
