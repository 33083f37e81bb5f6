"""megatron's own optimizer on the CPU shim (``compat.CudaOnCpu``): the ``DistributedOptimizer`` at DP=2 and
TP=2 x DP=2 over gloo against one process running the CPU default (a torch AdamW over megatron DDP's ``main_grad``) on the
same global batch, clipping active (``maxGradNorm`` 0.1 against norms ~0.5-1.1), two minibatches of
micro-batches per step: per-token log-probs, loss, grad norm and weights after three steps within 1e-4. A
non-finite loss on one rank skips that update on every rank (the sharded optimizer state stays in step).

Spawns real processes (megatron-core, gloo, the project's actor): ~1.5 min on loaded cores.
"""

from typing import Any

import pytest

from tests.support.parallel_ranks import job, run_ranks

TOL = 1e-4
pytestmark = pytest.mark.slow


def _job(distributed_optimizer: bool) -> dict[str, Any]:
    out = job()
    out["actor"] = {"megatron": {"distributedOptimizer": distributed_optimizer}}
    return out


def _diffs(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, float]:
    mask = ref["mask"]
    pairs = list(zip(ref["steps"], got["steps"], strict=True))
    return {
        "logp": max(float((a["logp"] - b["logp"])[mask].abs().max()) for a, b in pairs),
        "loss": max(abs(a["loss"] - b["loss"]) for a, b in pairs),
        "grad_norm": max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in pairs),
        "weights": max(float((ref["weights"][k] - got["weights"][k]).abs().max()) for k in ref["weights"]),
    }


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    (ref,) = run_ranks(1, 1, str(tmp_path_factory.mktemp("one")), {"job": _job(False)})
    assert ref["optimizer"] == "MainGradAdamW/AdamW"
    assert all(s["grad_norm"] > 0.1 for s in ref["steps"])  # the clip acts on every step
    return ref


@pytest.mark.parametrize(("world", "tp"), [(2, 1), (4, 2)], ids=["dp2", "tp2xdp2"])
def test_the_distributed_optimizer_equals_one_process(one_process: dict[str, Any], tmp_path: Any,
                                                      world: int, tp: int) -> None:
    ranks = run_ranks(world, tp, str(tmp_path), {"job": _job(True)})
    for rank in ranks:
        assert rank["optimizer"] == "MegatronAdam/DistributedOptimizer"
        assert rank["dp"] == (rank["rank"] // tp, world // tp)
        assert [s["stepped"] for s in rank["steps"]] == [True, True, True]
        diffs = _diffs(one_process, rank)
        print(f"distributed optimizer, world {world} tp {tp} rank {rank['rank']}: "
              + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs


def test_a_non_finite_loss_on_one_rank_skips_the_update_on_every_rank(tmp_path: Any) -> None:
    import torch

    ranks = run_ranks(2, 1, str(tmp_path), {"job": _job(True), "nan_on_rank": 1, "steps": 1})
    a, b = (r["steps"][0] for r in ranks)
    # minibatch 1 of 2 had a NaN on rank 1 only: skipped on both; minibatch 2 applied on both
    assert (a["skipped"], a["applied"]) == (b["skipped"], b["applied"]) == (1, 1)
    assert a["stepped"] and b["stepped"] and a["version"] == b["version"] == 1
    for k in ranks[0]["weights"]:
        assert torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]), k
