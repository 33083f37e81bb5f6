"""Weight sync in buckets: every family's HF state dict survives packing bit for bit (fp32 and the bf16
wire cast), bucket sizes are honoured, the object-store and disk transports round-trip, bad buckets
are refused with the numbers."""

from pathlib import Path

import pytest
import torch

from asyncrl.trainer.megatron.convert import hf_to_megatron, megatron_to_hf
from asyncrl.trainer.megatron.hf_folder import load_hf
from asyncrl.trainer.weight_sync import disk
from asyncrl.trainer.weight_sync.buckets import ALIGN, pack_buckets, total_bytes, unpack_all, unpack_bucket
from asyncrl.trainer.weight_sync.source import actor_buckets, wire_dtype
from asyncrl.trainer.weight_sync.transport import make_transport, receive
from tests.support.hf_models import ALL_FAMILIES, folder_arch, tiny_folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


def _expected(mcore: dict[str, torch.Tensor], arch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in megatron_to_hf(mcore, arch).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_buckets_reassemble_bit_exactly(root: Path, family: str, dtype: torch.dtype) -> None:
    folder = tiny_folder(root, family)
    arch = folder_arch(folder)
    mcore = hf_to_megatron(load_hf(str(folder)), arch)  # what the actor holds (TP = 1)
    # 3 KiB buckets: the tiny models span many buckets, and some tensors exceed one (a bucket alone).
    buckets = list(actor_buckets(mcore, arch, version=7, bucket_mib=1, dtype=dtype))
    small = list(pack_buckets(megatron_to_hf(mcore, arch).items(), version=7, bucket_bytes=3072, dtype=dtype))
    expected = _expected(mcore, arch, dtype)
    for bs in (buckets, small):
        got = unpack_all((b.manifest, b.data) for b in bs)
        assert list(got) == list(expected)  # the converter's order, every name once
        for k, v in expected.items():
            assert got[k].dtype == dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k].view(torch.uint8), v.contiguous().view(torch.uint8)), k  # bit for bit
        assert total_bytes(b.manifest for b in bs) == sum(v.numel() * v.element_size() for v in expected.values())
    assert len(small) > 3
    for b in small:  # each bucket within its size unless it holds one tensor larger than that
        assert b.manifest.nbytes <= 3072 or len(b.manifest.entries) == 1
        assert all(e.offset % ALIGN == 0 for e in b.manifest.entries)


def test_bucket_size_packs_greedily() -> None:
    # 4 tensors of 100 fp32 = 400 B, aligned to 448 B (7 x 64); a 1000 B bucket holds two (896 B).
    ts = [(f"t{i}", torch.full((100,), float(i))) for i in range(4)]
    bs = list(pack_buckets(ts, version=0, bucket_bytes=1000))
    assert [b.manifest.names for b in bs] == [["t0", "t1"], ["t2", "t3"]]
    assert [e.offset for e in bs[0].manifest.entries] == [0, 448]
    assert bs[0].manifest.nbytes == 896


def test_wire_dtype() -> None:
    assert wire_dtype("bfloat16", needs_training_precision=False) == torch.bfloat16
    assert wire_dtype("bfloat16", needs_training_precision=True) == torch.float32  # interrupt-sync, dedicated
    assert wire_dtype("float32", needs_training_precision=False) == torch.float32


def test_bad_bucket_is_refused() -> None:
    (b,) = pack_buckets([("w", torch.ones(3))], version=1, bucket_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"bucket 0 of version 1 is torch.uint8 \[10\], the manifest says uint8 "
                                         r"\[64\]"):
        unpack_bucket(b.manifest, b.data[:10])
    (b2,) = pack_buckets([("v", torch.ones(3))], version=2, bucket_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"tensors \['w'\] arrive in two buckets"):
        unpack_all([(b.manifest, b.data), (b.manifest, b.data)])
    with pytest.raises(ValueError, match=r"versions \[1, 2\] mixed"):
        unpack_all([(b.manifest, b.data), (b2.manifest, b2.data)])
    with pytest.raises(ValueError, match=r"valid: \['broadcast', 'disk', 'objectStore'\]"):
        make_transport("nccl")


def test_disk_transport_round_trip_keeps_newest(tmp_path: Path, root: Path) -> None:
    folder = tiny_folder(root, "qwen2")
    arch = folder_arch(folder)
    mcore = hf_to_megatron(load_hf(str(folder)), arch)
    t = make_transport("disk", root=str(tmp_path / "sync"), keep=2)
    handles = [t.publish(actor_buckets(mcore, arch, version=v, bucket_mib=1, dtype=torch.bfloat16), v)
               for v in (1, 2, 3)]
    assert disk.versions(tmp_path / "sync") == [2, 3]  # newest 2 kept
    assert not [p for p in (tmp_path / "sync").iterdir() if p.name.startswith(".tmp")]  # nothing half-written
    latest = disk.latest(tmp_path / "sync")
    assert latest == handles[-1]
    got = t.receive(latest).state
    expected = _expected(mcore, arch, torch.bfloat16)
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    with pytest.raises(FileNotFoundError, match="version 1 pruned"):
        t.receive(handles[0])


def test_object_store_transport_round_trip(ray_session: None, root: Path) -> None:
    from asyncrl.trainer.weight_sync.objectstore import BucketRefs

    folder = tiny_folder(root, "llama")
    arch = folder_arch(folder)
    mcore = hf_to_megatron(load_hf(str(folder)), arch)
    t = make_transport("objectStore")
    handle = t.publish(pack_buckets(megatron_to_hf(mcore, arch).items(), version=4, bucket_bytes=4096), 4)
    assert isinstance(handle, BucketRefs) and len(handle.refs) > 3
    got = receive(handle)
    assert got.version == 4 and got.nbytes == handle.payload_bytes
    expected = megatron_to_hf(mcore, arch)
    assert all(torch.equal(got.state[k], v) for k, v in expected.items())
