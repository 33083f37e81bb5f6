"""megatron's own optimizer on the CPU shim (``compat.CudaOnCpu``): the ``DistributedOptimizer`` at DP=2 over
gloo against one process running the CPU default (a torch AdamW over megatron DDP's ``main_grad``) on the
same global batch, clipping active (``maxGradNorm`` 0.1 against norms ~0.5-1.1), two minibatches of
micro-batches per step: per-token log-probs, loss, grad norm and weights after three steps within 1e-4.

Spawns real processes (megatron-core, gloo, the project's actor): ~1 min on loaded cores.
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


def test_the_distributed_optimizer_at_dp2_equals_one_process(tmp_path: Any) -> None:
    (tmp_path / "one").mkdir()
    (ref,) = run_ranks(1, 1, str(tmp_path / "one"), {"job": _job(False)})
    assert ref["optimizer"] == "MainGradAdamW/AdamW"
    assert all(s["grad_norm"] > 0.1 for s in ref["steps"])  # the clip acts on every step
    (tmp_path / "dp2").mkdir()
    ranks = run_ranks(2, 1, str(tmp_path / "dp2"), {"job": _job(True)})
    for rank in ranks:
        assert rank["optimizer"] == "MegatronAdam/DistributedOptimizer"
        assert rank["dp"] == (rank["rank"], 2)
        assert [s["stepped"] for s in rank["steps"]] == [True, True, True]
        diffs = _diffs(ref, rank)
        print(f"distributed optimizer, dp2 rank {rank['rank']}: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs
