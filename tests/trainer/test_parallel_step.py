"""The step is exact across layouts: DP=2, TP=2 and TP=2 x DP=2 gloo ranks against one process on the same
global batch, clipping active (``maxGradNorm`` 0.1 against norms ~0.5-1.1), two minibatches of micro-batches
per step: per-token log-probs, loss, grad norm and weights after three steps within 1e-4. A non-finite loss
on one rank skips that update on every rank (no hang).

Each layout spawns real processes (megatron-core, gloo, the project's actor): ~1 min each on loaded cores.
"""

from typing import Any

import pytest
import torch

from tests.support.parallel_ranks import job, run_ranks

TOL = 1e-4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("world1")
    (ref,) = run_ranks(1, 1, str(out), {"job": job(), "norm_probe": True})
    assert all(s["grad_norm"] > 0.1 for s in ref["steps"])  # the clip acts on every step
    return ref


def _diffs(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, float]:
    mask = ref["mask"]
    logp = max(float((a["logp"] - b["logp"])[mask].abs().max()) for a, b in zip(ref["steps"], got["steps"], strict=True))
    loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(ref["steps"], got["steps"], strict=True))
    norm = max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in zip(ref["steps"], got["steps"], strict=True))
    weights = max(float((ref["weights"][k] - got["weights"][k]).abs().max()) for k in ref["weights"])
    return {"logp": logp, "loss": loss, "grad_norm": norm, "weights": weights}


@pytest.mark.parametrize(("world", "tp"), [(2, 1), (2, 2), (4, 2)], ids=["dp2", "tp2", "tp2xdp2"])
def test_the_step_equals_one_process(one_process: dict[str, Any], tmp_path: Any, world: int, tp: int) -> None:
    ranks = run_ranks(world, tp, str(tmp_path), {"job": job(), "norm_probe": True})
    for rank in ranks:
        assert rank["dp"] == (rank["rank"] // tp, world // tp)
        # the per-shard norm of the stock clip is wrong under TP; the model-parallel one equals one process
        assert abs(rank["norms"]["aware"] - one_process["norms"]["aware"]) < TOL
        if tp > 1:
            assert abs(rank["norms"]["stock"] - one_process["norms"]["stock"]) > 0.1
        assert [s["stepped"] for s in rank["steps"]] == [True, True, True]
        assert [s["valid_tokens"] for s in rank["steps"]] == [s["valid_tokens"] for s in one_process["steps"]]
        diffs = _diffs(one_process, rank)
        print(f"world {world} tp {tp} rank {rank['rank']}: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs


def test_a_non_finite_loss_on_one_rank_skips_the_update_on_every_rank(tmp_path: Any) -> None:
    ranks = run_ranks(2, 1, str(tmp_path), {"job": job(), "nan_on_rank": 1, "steps": 1})
    a, b = (r["steps"][0] for r in ranks)
    # minibatch 1 of 2 had a NaN on rank 1 only: skipped on both; minibatch 2 applied on both
    assert (a["skipped"], a["applied"]) == (b["skipped"], b["applied"]) == (1, 1)
    assert a["stepped"] and b["stepped"] and a["version"] == b["version"] == 1
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-7)
    for k in ranks[0]["weights"]:
        assert torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]), k
