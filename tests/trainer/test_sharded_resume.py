"""A checkpoint resumes at another layout: saved by TP=2 ranks and resumed at TP=1 and at DP=2, saved by one
process and resumed at TP=2 (the sharded folder, and a former single-file ``actor.pt``). The version
sequence continues and the next step equals the uninterrupted run: log-probs, loss, grad norm and weights
within 1e-5 (clipping active, two minibatches of micro-batches per step).

References that keep tensors per parameter: ``ewma`` (``theta_prox`` resharded) from TP=2, and ``exact``
with the snapshot strategy from one process (every batch token is version 0: the resumed step scores it
under the v0 snapshot the checkpoint kept, resharded to TP=2).

Every run spawns real ranks (megatron-core, gloo, the project's actor): minutes on loaded cores.
"""

from typing import Any

import pytest

from tests.support.parallel_ranks import job
from tests.support.sharded_ranks import run_layout, step_diffs

TOL = 1e-5
pytestmark = pytest.mark.slow


def _check(uninterrupted: dict[str, Any], resumed: list[dict[str, Any]], label: str) -> None:
    for rank in resumed:
        assert rank["loaded_version"] == 2
        assert [s["version"] for s in rank["steps"]] == [3]  # the sequence continues
        diffs = step_diffs(uninterrupted, rank, slice(2, 3))
        print(f"{label} rank {rank['rank']}: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs


@pytest.fixture(scope="module")
def from_tp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """An uninterrupted TP=2 run of 3 steps that saved its checkpoint at version 2."""
    out = tmp_path_factory.mktemp("tp2")
    ranks = run_layout(2, 2, str(out / "run"), {"job": job("ewma"), "before": 2, "save": str(out / "ckpt"), "after": 1})
    assert [s["version"] for s in ranks[0]["steps"]] == [1, 2, 3]
    return ranks[0], str(out / "ckpt")


@pytest.mark.parametrize(("world", "tp"), [(1, 1), (2, 1)], ids=["tp1", "dp2"])
def test_a_tp2_checkpoint_resumes_at_another_layout(from_tp2: tuple[dict[str, Any], str], tmp_path: Any,
                                                    world: int, tp: int) -> None:
    uninterrupted, ckpt = from_tp2
    resumed = run_layout(world, tp, str(tmp_path), {"job": job("ewma"), "load": ckpt, "after": 1})
    _check(uninterrupted, resumed, f"tp2 -> world {world} tp {tp}")


def test_a_one_process_checkpoint_resumes_at_tp2_sharded_or_single_file(tmp_path: Any) -> None:
    exact = {**job("exact"), "oldLogits": {"strategy": "snapshot"}}
    cfg = {"job": exact, "before": 2, "save": str(tmp_path / "ckpt"),
           "save_single_file": str(tmp_path / "old"), "after": 1}
    (uninterrupted,) = run_layout(1, 1, str(tmp_path / "run"), cfg)
    for folder in ("ckpt", "old"):
        resumed = run_layout(2, 2, str(tmp_path / f"resumed-{folder}"),
                             {"job": exact, "load": str(tmp_path / folder), "after": 1})
        _check(uninterrupted, resumed, f"tp1 -> tp2 ({folder})")
