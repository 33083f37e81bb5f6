"""Every correction route with a sharded actor: each reference (``behavior``, ``current``, ``linear``,
``loglinear``, ``ewma``), each exact strategy that runs inside the actor process (``snapshot`` in host memory
and on disk; the actor's half of ``dedicated`` and ``interruptSync``) and the live audit, under DP=2 and TP=2
(and TP=2 x DP=2) gloo ranks against one process on the same global batches, clipping active
(``maxGradNorm`` 0.1 against norms ~0.8-1.4), two minibatches per step, three steps whose batches mix versions
``v - 2 .. v`` inside rows: per-token ``logp_ref`` and log-probs, loss, grad norm and weights after three steps
within 1e-4; the EWMA reset decisions and the correction counts identical, the audit's figures (reduced
across DP) equal. Also: a snapshot version is held once per node and shard, not once per DP replica, and
each DP rank's reference forwards ran over its token-balanced share of the rows only (counted in the rank).

The default suite runs one route per layout (``snapshot`` under DP=2, ``ewma`` under TP=2: ~2 min of spawned
processes on loaded shared cores); the whole matrix is ``slow`` (one process group per layout trains every
route in turn).
"""

import math
from typing import Any

import pytest
import torch

from tests.support.parallel_ranks import ROUTES, run_routes

TOL = 1e-4
LAYOUTS = {"dp2": (2, 1), "tp2": (2, 2), "tp2xdp2": (4, 2)}
FAST = {"dp2": "snapshot", "tp2": "ewma"}  # the default suite's one route per layout


def route_diffs(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, float]:
    """Max |diff| of one route's figures against the one-process run (inf when a decision differs)."""
    out: dict[str, float] = {"logp": 0.0, "logp_ref": 0.0, "loss": 0.0, "grad_norm": 0.0, "counts": 0.0,
                             "audit": 0.0}
    for a, b in zip(ref["steps"], got["steps"], strict=True):
        mask = a["mask"]
        out["logp"] = max(out["logp"], float((a["logp"] - b["logp"])[mask].abs().max()))
        if a["logp_ref"] is not None:
            out["logp_ref"] = max(out["logp_ref"], float((a["logp_ref"] - b["logp_ref"])[mask].abs().max()))
        out["loss"] = max(out["loss"], abs(a["loss"] - b["loss"]))
        out["grad_norm"] = max(out["grad_norm"], abs(a["grad_norm"] - b["grad_norm"]))
        for key in ("stepped", "version", "ewma_reset", "ewma_resets_total"):
            if a[key] != b[key]:
                out[key] = math.inf
        for key, value in a["correction"].items():
            if key.endswith(("_tokens", "_seqs")):  # counts: identical
                out["counts"] = max(out["counts"], abs(value - b["correction"][key]))
        if set(a["audit"]) != set(b["audit"]):
            out["audit"] = math.inf
        for key, value in a["audit"].items():
            other = b["audit"][key]
            if not (math.isnan(value) and math.isnan(other)):
                out["audit"] = max(out["audit"], abs(value - other))
    out["weights"] = max(float((ref["weights"][k] - got["weights"][k]).abs().max()) for k in ref["weights"])
    return out


def _run(tmp: pytest.TempPathFactory, name: str, world: int, tp: int, routes: list[str]) -> list[dict[str, Any]]:
    return run_routes(world, tp, str(tmp.mktemp(f"out-{name}")), routes, str(tmp.mktemp(f"work-{name}")))


@pytest.fixture(scope="module")
def fast_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    (ref,) = _run(tmp_path_factory, "world1-fast", 1, 1, sorted(set(FAST.values())))
    return ref


@pytest.fixture(scope="module")
def dp2_snapshot(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _run(tmp_path_factory, "dp2-snapshot", 2, 1, ["snapshot"])


def check_route(route: str, ref: dict[str, Any], ranks: list[dict[str, Any]], layout: str) -> dict[str, float]:
    """Assert one route of one layout against one process; its worst figures over the ranks."""
    steps = ref["steps"]
    assert all(s["grad_norm"] > 0.1 for s in steps), "the clip (maxGradNorm 0.1) must act on every step"
    assert [s["stepped"] for s in steps] == [True, True, True]
    if route == "ewma":  # the reset rule decided both ways: keep at versions 1 and 2, reset at 3
        assert [s["ewma_reset"] for s in steps] == [False, False, True], [s["in_bounds_ratio"] for s in steps]
    if route == "audit":
        assert all(s["audit"]["audit_tokens"] > 0 for s in steps)
    worst: dict[str, float] = {}
    for rank in ranks:
        diffs = route_diffs(ref, rank)
        worst = {k: max(v, worst.get(k, 0.0)) for k, v in diffs.items()}
    exact = {k: v for k, v in worst.items() if k in ("counts", "stepped", "version", "ewma_reset", "ewma_resets_total")}
    assert all(v == 0.0 for v in exact.values()), (route, layout, worst)  # decisions and counts identical
    assert max(worst.values()) < TOL, (route, layout, worst)
    return worst


def check_reference_shares(route: str, ref: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """Each DP rank ran the reference forwards over its token-balanced share of the rows only (the
    provider's forward calls, counted in the rank, add up to that share's rows and trained tokens), the
    shares of the DP ranks partition the batch, and TP ranks of one replica scored the same rows."""
    from asyncrl.trainer.megatron.parallel import dp_share

    for i, one in enumerate(ref["routes"][route]["steps"]):
        assert one["reference_rows"] == list(range(one["mask"].shape[0]))
        assert [sum(c) for c in zip(*one["forwarded"], strict=True)] == [len(one["reference_rows"]),
                                                                          int(one["mask"].sum())]
        by_dp: dict[int, list[int]] = {}
        for rank in ranks:
            step = rank["routes"][route]["steps"][i]
            dp_rank, dp_size = rank["dp"]
            mask = step["mask"]
            want = dp_share(torch.arange(mask.shape[0]), mask, dp_rank, dp_size).tolist()
            assert step["reference_rows"] == want, (route, rank["rank"], step["reference_rows"], want)
            rows, tokens = (sum(c) for c in zip(*step["forwarded"], strict=True))
            assert (rows, tokens) == (len(want), int(mask[want].sum())), (route, rank["rank"], step["forwarded"])
            assert by_dp.setdefault(dp_rank, want) == want  # TP ranks of a replica: the same rows
        if len(by_dp) > 1:
            every = sorted(r for rows in by_dp.values() for r in rows)
            assert every == one["reference_rows"], (route, by_dp)  # a partition: each row scored once


def _line(route: str, layout: str, worst: dict[str, float]) -> str:
    return f"{route:>14} {layout:>8} " + " ".join(f"{k} {v:.1e}" for k, v in worst.items())


@pytest.mark.parametrize("layout", list(FAST))
def test_one_route_per_layout_equals_one_process(layout: str, fast_reference: dict[str, Any],
                                                 dp2_snapshot: list[dict[str, Any]],
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    route = FAST[layout]
    world, tp = LAYOUTS[layout]
    ranks = dp2_snapshot if layout == "dp2" else _run(tmp_path_factory, layout, world, tp, [route])
    worst = check_route(route, fast_reference["routes"][route], [r["routes"][route] for r in ranks], layout)
    print(_line(route, layout, worst))


def test_dp_ranks_score_the_reference_over_their_share_only(fast_reference: dict[str, Any],
                                                           dp2_snapshot: list[dict[str, Any]]) -> None:
    """DP=2: each rank's snapshot forwards ran over half the rows (token-balanced), not the whole batch."""
    check_reference_shares("snapshot", fast_reference, dp2_snapshot)
    halves = [sum(c[0] for c in r["routes"]["snapshot"]["steps"][0]["forwarded"]) for r in dp2_snapshot]
    assert halves == [4, 4], halves  # B = 8


def test_snapshot_versions_are_held_once_per_node(fast_reference: dict[str, Any],
                                                  dp2_snapshot: list[dict[str, Any]]) -> None:
    """DP=2 on one node: the lowest DP rank writes each version once (in /dev/shm), both map it."""
    one = fast_reference["routes"]["snapshot"]["steps"][-1]["resident"]  # one process: 3 versions in memory
    assert one["versions"] == 3 and one["shared_bytes"] == 0
    last = [r["routes"]["snapshot"]["steps"][-1] for r in sorted(dp2_snapshot, key=lambda r: r["rank"])]
    writer, reader = (s["resident"] for s in last)
    assert writer["versions"] == reader["versions"] == 3
    assert writer["nbytes"] == reader["nbytes"] == one["nbytes"]  # each rank reads every version of its shard
    assert (writer["shared_bytes"], reader["shared_bytes"]) == (0, one["nbytes"])  # rank 1 holds no copy
    node = sum(r["nbytes"] - r["shared_bytes"] for r in (writer, reader))
    assert node == one["nbytes"]  # one copy on the node (each replica's own copy before: 2x)
    # The files: one per version and shard in one node folder, seen by both ranks; their tensor bytes are
    # the one copy, and the pages both processes map add up (proportional set size) to at most that copy.
    assert last[0]["files"] == last[1]["files"] and len(last[0]["files"]) == 3
    assert all(name.startswith(("v1-tp0-pp0-n0", "v2-tp0-pp0-n0", "v3-tp0-pp0-n0")) for name in last[0]["files"])
    on_disk = sum(last[0]["files"].values())
    assert one["nbytes"] < on_disk < one["nbytes"] + 3 * 4096  # + the safetensors headers
    pss = [s["pss"] for s in last]
    assert all(p > 0 for p in pss) and sum(pss) <= on_disk + 3 * 2 * 4096, pss
    print(f"snapshot bytes, DP=2 on one node: one process {one['nbytes']}, node {node} (rank 0 writes "
          f"{writer['nbytes'] - writer['shared_bytes']}, rank 1 {reader['nbytes'] - reader['shared_bytes']}); "
          f"files {on_disk}; mapped PSS {pss[0]} + {pss[1]} = {sum(pss)}")
    folders = {r["routes"]["snapshot"]["folder"] for r in dp2_snapshot}
    assert len(folders) == 1 and all(r["routes"]["snapshot"]["left"] is None for r in dp2_snapshot), folders


@pytest.fixture(scope="module")
def full_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    (ref,) = _run(tmp_path_factory, "world1-all", 1, 1, list(ROUTES))
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_route_equals_one_process(layout: str, full_reference: dict[str, Any],
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    routes, ref = list(ROUTES), full_reference
    world, tp = LAYOUTS[layout]
    ranks = _run(tmp_path_factory, layout, world, tp, routes)
    lines, failures = [], []
    for route in routes:
        try:
            lines.append(_line(route, layout, check_route(route, ref["routes"][route],
                                                          [r["routes"][route] for r in ranks], layout)))
            check_reference_shares(route, ref, ranks)
        except AssertionError as exc:
            failures.append(f"{route}: {exc}")
    print("\n".join(lines))
    assert not failures, failures
    if layout == "tp2xdp2":  # two DP groups (one per TP shard), each shares its versions on the node
        for rank in ranks:
            last = rank["routes"]["snapshot"]["steps"][-1]
            assert last["sharers"] == 2 and last["resident"]["shared_bytes"] == (
                last["resident"]["nbytes"] if rank["dp"][0] == 1 else 0)
