"""bench/async_speedup.py and bench/minibatches.py: the jobs they compare differ only in what they
claim to vary, and their learning comparisons (equal versions, equal wall-clock, first to a target)
read the evaluation curve right. The runs themselves are benchmarks, not tests (machines are noisy)."""

import argparse
import importlib.util
import sys
from types import ModuleType
from typing import Any

from asyncrl.api.validation import quickstart_doc, validate_job
from tests.support.helpers import ROOT


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # minibatches imports its sibling async_speedup
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


minibatches = _load("minibatches")
async_speedup = _load("async_speedup")


def _curve(points: list[tuple[int, float, float]]) -> list[dict[str, Any]]:
    return [{"version": v, "loop_s": t, "success": s} for v, t, s in points]


def test_minibatch_bench_runs_the_quickstart_with_only_the_minibatches_changed() -> None:
    args = argparse.Namespace(epochs=1, seed=0, steps=0)
    one, four = (validate_job(minibatches.job(k, args)).spec.to_spec_dict() for k in (1, 4))
    quick = validate_job(quickstart_doc()).spec.to_spec_dict()
    assert four["train"]["minibatches"] == 4 and one["train"].get("minibatches", 1) == 1
    for spec in (one, four):
        assert spec["task"] == quick["task"] and spec["correction"] == quick["correction"]
        assert spec["eval"] == quick["eval"] and spec["async"] == quick["async"]
        assert {k: v for k, v in spec["train"].items() if k != "minibatches"} == \
            {k: v for k, v in quick["train"].items() if k != "minibatches"}
    assert validate_job(minibatches.job(4, argparse.Namespace(epochs=2, seed=0, steps=7))).spec.train.steps == 7


def test_first_evaluation_reaching_the_target() -> None:
    curve = _curve([(0, 0.0, 0.4), (10, 5.0, 0.79), (20, 9.0, 0.8), (30, 14.0, 0.95)])
    assert minibatches.first_reaching(curve, 0.8)["version"] == 20
    assert minibatches.first_reaching(curve, 0.99) is None


def test_async_bench_compares_at_equal_versions_and_equal_wall_clock() -> None:
    sync = {"loop_s": 60.0, "eval_curve": _curve([(0, 0.0, 0.4), (10, 20.0, 0.6), (20, 40.0, 0.8), (30, 60.0, 0.9)])}
    asyn = {"loop_s": 31.0, "eval_curve": _curve([(0, 0.0, 0.4), (10, 10.0, 0.5), (20, 20.0, 0.7), (30, 30.0, 0.8)])}
    assert async_speedup.equal_versions(sync, asyn) == [(0, 0.4, 0.4), (10, 0.6, 0.5), (20, 0.8, 0.7), (30, 0.9, 0.8)]
    rows = async_speedup.equal_wall_clock(sync, asyn)
    assert [r["loop_s"] for r in rows] == [7.5, 15.0, 22.5, 30.0]
    # at 30 s of training the synchronous run has only evaluated version 10, the asynchronous one 30
    assert (rows[-1]["sync_version"], rows[-1]["sync_success"], rows[-1]["async_version"]) == (10, 0.6, 30)
    assert (rows[0]["sync_version"], rows[0]["async_version"]) == (0, 0)
    for w in (0, 2):
        spec = validate_job(async_speedup.job(w, argparse.Namespace(
            reference="current", partial_rollout=False, task="calculator", group=8, steps=6, prompts=4,
            warm_start_steps=10, replicas=1, eval_every=3, eval_prompts=16), "ewma")).spec
        assert spec.async_.max_staleness == w and spec.eval.every_steps == 3 and spec.eval.prompts == 16
        assert spec.correction.reference.value == "ewma"
