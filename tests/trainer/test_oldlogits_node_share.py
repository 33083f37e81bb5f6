"""The snapshot store of a data-parallel actor holds each version once per node (``trainer/oldlogits/node_share.py``).

Two real gloo ranks (DP=2, megatron's parallel state, no model) record the same versions in lockstep, as the
actor's stages do: the lowest DP rank writes each version's file once, both map it; release and close remove
the files; a checkpoint taken on the rank that only maps still holds the tensors; a resume rebuilds the shared
files. For ``device: cpu`` the files live in a fresh ``/dev/shm`` folder, for ``disk`` in the folder both ranks
were given (file names carry the shard and node, so nothing collides).
"""

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.rank_processes import rank_context


def _weights(v: int) -> dict[str, torch.Tensor]:
    return {"a": torch.full((1000,), float(v)), "b": torch.arange(12.0).reshape(3, 4) + v}  # 4048 bytes


def _files(folder: Path | None) -> list[str]:
    return [] if folder is None or not folder.exists() else sorted(p.name for p in folder.iterdir())


def _rank(rank: int, init_method: str, out: str, device: str, work_dir: str | None) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from asyncrl.trainer.megatron import compat
    from asyncrl.trainer.oldlogits import WeightSnapshots

    compat.init_megatron(0, device="cpu", tp=1, rank=rank, world=2, init_method=init_method)
    store = WeightSnapshots(3, device=device, work_dir=work_dir)  # type: ignore[arg-type]
    seen: dict[str, Any] = {}
    for v in range(4):  # the cap of 3 gives up v0 when v3 arrives
        store.record(v, _weights(v))
    dist.barrier()
    seen["versions"], seen["resident"] = store.versions, vars(store.resident()).copy()
    seen["files"], seen["folder"] = _files(store.folder), str(store.folder)
    dist.barrier()  # both listed before the writer deletes v1 (retain)
    seen["v2_ok"] = all(torch.equal(store.get(2)[k], t) for k, t in _weights(2).items())
    store.retain({2, 3})
    dist.barrier()
    seen["after_retain"] = _files(store.folder)
    dist.barrier()  # both listed before the writer rewrites the files (load_state_dict)
    state = store.state_dict()  # what a checkpoint keeps: tensors, on every rank
    seen["state_ok"] = sorted(state["versions"]) == [2, 3] and torch.equal(state["versions"][3]["a"], _weights(3)["a"])
    store.load_state_dict(state)  # a resume, in lockstep: the writer rewrites, every rank maps again
    dist.barrier()
    seen["after_load"], seen["reloaded"] = _files(store.folder), vars(store.resident()).copy()
    dist.barrier()  # both listed before the writer deletes them (close)
    store.close()
    dist.barrier()
    seen["after_close"] = _files(store.folder)
    torch.save(seen, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _run(tmp_path: Path, device: str, work_dir: str | None) -> list[dict[str, Any]]:
    from asyncrl.trainer.megatron.parallel import rendezvous

    init_method = rendezvous("127.0.0.1")
    ctx = rank_context()
    procs = [ctx.Process(target=_rank, args=(r, init_method, str(tmp_path), device, work_dir)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed: its traceback is in the captured stderr"
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow  # two spawned ranks importing megatron: 3-5 min on loaded shared cores
@pytest.mark.parametrize("device", ["cpu", "disk"])
def test_two_data_parallel_ranks_on_one_node_hold_one_copy(tmp_path: Path, device: str) -> None:
    work_dir = str(tmp_path / "snapshots") if device == "disk" else None
    writer, reader = _run(tmp_path, device, work_dir)
    names = [f"v{v}-tp0-pp0-n0.safetensors" for v in (1, 2, 3)]
    for seen in (writer, reader):
        assert seen["versions"] == [1, 2, 3] and seen["v2_ok"] and seen["state_ok"]
        assert seen["files"] == names  # one file per version for the node, seen by both
        assert seen["after_retain"] == names[1:] and seen["after_load"] == names[1:]
        assert seen["after_close"] == []
    assert writer["folder"] == reader["folder"]
    if device == "disk":
        assert writer["folder"] == work_dir
    else:
        assert writer["folder"].startswith("/dev/shm/asyncrl-snapshots-") and not Path(writer["folder"]).exists()
    # Each rank reads the three versions (nbytes); rank 1 maps rank 0's copy: the node holds one.
    assert writer["resident"]["nbytes"] == reader["resident"]["nbytes"] > 0
    assert (writer["resident"]["shared_bytes"], reader["resident"]["shared_bytes"]) == (0, reader["resident"]["nbytes"])
    if device == "cpu":
        assert writer["resident"]["nbytes"] == 3 * 4048  # tensor bytes: the one copy
    assert reader["reloaded"]["shared_bytes"] == reader["reloaded"]["nbytes"] == 2 * writer["resident"]["nbytes"] // 3
