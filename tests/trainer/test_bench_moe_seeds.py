"""The MoE routing-replay training comparison (bench/paper/moe_seeds.py, docs/results/moe-replay-plan.md): the arms
differ only in routingReplay, the section reads its records alone with hand-derived numbers, the plan's regime
rule, and records of another scale are refused."""

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.helpers import paper_module


@pytest.fixture(scope="module")
def ms() -> ModuleType:
    return paper_module("moe_seeds")


def _rec(arm: str, seed: int, v0: float, late: tuple[float, float], keep: float, *, steps: int = 20,
         lr: float = 3e-4) -> dict:
    stp = [{"version": v, "in_bounds_ratio": keep, "kl_k3": 1e-3 if arm == "replay_off" else 1e-4,
            **({"route_flip_frac": 0.25} if arm == "r3" else {})} for v in range(1, steps + 1)]
    return {"kind": "moe_seeds", "arm": arm, "seed": seed, "steps": stp, "keep_ratio_mean": keep,
            "eval_curve": [{"version": 0, "success": v0}, {"version": 10, "success": late[0]},
                           {"version": 20, "success": late[1]}],
            "scale": {"steps": steps, "learning_rate": lr, "prompts": 4, "group": 8, "minibatches": 4,
                      "eval_prompts": 256, "eval_every": 10, "warm_start_steps": 1500, "warm_batch": 64},
            "actor_learning_rate": lr, "moe": {"experts": 8, "top_k": 2, "family": "qwen3_moe"},
            "load_avg_start": [3.0, 3.0, 3.0], "load_avg_end": [3.0, 3.0, 3.0], "wall_s": 60.0}


def _write(data: Path, recs: list[dict]) -> None:
    folder = data / "moe_seeds"
    folder.mkdir(parents=True, exist_ok=True)
    for r in recs:
        (folder / f"{r['arm']}-s{r['seed']}.json").write_text(json.dumps(r))


def test_the_arms_differ_only_in_routing_replay(ms: ModuleType) -> None:
    off, r3 = ms.ARMS
    assert (off.name, r3.name) == ("replay_off", "r3")
    assert off.correction["routingReplay"] == "none" and r3.correction["routingReplay"] == "rollout"
    strip = lambda c: {k: v for k, v in c.items() if k != "routingReplay"}  # noqa: E731
    assert strip(off.correction) == strip(r3.correction)
    assert off.correction["reference"] == "exact" and off.old_logits == r3.old_logits == {"strategy": "snapshot"}
    assert off.correction["mask"]["bounds"] == {"low": 0.99, "high": 1.01}
    assert off.max_staleness == r3.max_staleness and off.key() != r3.key()
    assert len(ms.SEEDS) >= 5 and ms.SCALE.steps == 20 and ms.SCALE.eval_every == 10


def test_a_full_folder_names_its_own_model(ms: ModuleType, tmp_path: Path) -> None:
    ext = paper_module("external")
    bare = tmp_path / "bare"
    bare.mkdir()
    assert ext.job_doc(ms.ARMS[0], ms.SCALE, 30, bare)["spec"]["model"]["preset"] == "tiny-llama"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    model = ext.job_doc(ms.ARMS[1], ms.SCALE, 30, tmp_path / "full")["spec"]["model"]
    assert "preset" not in model and model["rolloutDtype"] == "bfloat16"


def test_section_by_hand(ms: ModuleType, tmp_path: Path) -> None:
    # endpoints (mean of versions 10 and 20 minus v0): off 0.10, 0.00, 0.05; r3 0.20, 0.10, 0.20 (seed by seed
    # r3 - off = 0.10, 0.10, 0.15; the arms correlate (r = 0.866 >= 0.25), so the test is paired:
    # mean 0.11667, sd of the differences 0.028868, t = 0.11667 / (0.028868 / sqrt 3) = 7.0 on 2 dof
    off = [_rec("replay_off", 30, 0.1, (0.2, 0.2), 0.50), _rec("replay_off", 31, 0.2, (0.1, 0.3), 0.52),
           _rec("replay_off", 32, 0.1, (0.1, 0.2), 0.54)]
    r3 = [_rec("r3", 30, 0.1, (0.3, 0.3), 0.60), _rec("r3", 31, 0.2, (0.3, 0.3), 0.60), _rec("r3", 32, 0.1, (0.3, 0.3), 0.60)]
    _write(tmp_path, off + r3)
    runs = ms.runs(tmp_path)
    t, p_adj, verdict = ms.primary(runs)
    assert t.name == "paired t" and t.diff == pytest.approx(0.35 / 3, abs=1e-12)
    assert t.stat == pytest.approx(7.0, rel=1e-9) and p_adj == t.p and verdict == "held"
    st = paper_module("stats")
    assert t.p == pytest.approx(st.t_two_sided_p(7.0, 2), rel=1e-9)
    ok, text = ms.regime(runs)
    assert ok and "gap +0.0800" in text
    md = ms.section(tmp_path)
    assert "**Primary (the plan's one hypothesis): held.**" in md and "+0.117" in md
    assert "| route flip share | - | 0.2500 ± 0.0000 | - |" in md  # measured only under replay
    # the same numbers with the keep ratios equal: routing replay has nothing to fix -> uninformative
    _write(tmp_path, [{**r, "keep_ratio_mean": 0.6} for r in off])
    assert not ms.regime(ms.runs(tmp_path))[0]
    assert "uninformative (regime not reached; the test alone reads held)" in ms.section(tmp_path)


def test_no_records_and_other_scales(ms: ModuleType, tmp_path: Path) -> None:
    assert "No records under" in ms.section(tmp_path)
    _write(tmp_path, [_rec("r3", 30, 0.1, (0.2, 0.2), 0.6, steps=40)])
    with pytest.raises(ValueError, match="plan's scale is 20"):
        ms.runs(tmp_path)
    _write(tmp_path, [_rec("r3", 30, 0.1, (0.2, 0.2), 0.6, lr=1e-3)])
    with pytest.raises(ValueError, match="learning rate"):
        ms.runs(tmp_path)
    assert math.isnan(ms.step_mean({"steps": [{"version": 1}]}, "kl_k3"))
