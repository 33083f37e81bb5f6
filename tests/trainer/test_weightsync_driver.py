"""The driver's receiving end: a rollout host takes a version from bucket refs in the object store,
installs it bit for bit (bf16 on the wire = the engine's own rounding), reports transfer apart from
pause, and a late joiner (a replacement worker) given the latest handle holds the same version."""


import pytest
import torch

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.hosts.fleet import RolloutHost
from asyncrl.trainer.driver.loop.stage import sync_report
from asyncrl.trainer.megatron.convert import hf_shapes
from asyncrl.trainer.weight_sync.buckets import pack_buckets
from asyncrl.trainer.weight_sync.objectstore import publish
from asyncrl.trainer.weight_sync.outcome import Delivered

JOB = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "ws"},
       "spec": {"task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 8}, "rollout": {"replicas": 2}}}


@pytest.mark.slow  # two rollout hosts and a local Ray: ~90 s on loaded cores
def test_rollout_host_installs_bucketed_versions_and_a_late_joiner_matches(ray_session: None) -> None:
    spec = validate_job(JOB).spec
    spec_json = spec.model_dump(mode="json", by_alias=True)
    host = RolloutHost(spec_json, 0, threads=1)
    arch = host.worker.arch
    g = torch.Generator().manual_seed(3)
    hf = {k: torch.randn(s, generator=g) * 0.05 for k, s in hf_shapes(arch).items()}
    if arch.tie_embeddings:
        hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
    # 64 KiB buckets: many of them, as a big model's 512 MiB buckets would be.
    handle = publish(pack_buckets(hf.items(), version=3, bucket_bytes=65536, dtype=torch.bfloat16))
    assert len(handle.refs) > 3
    out = host.update_weights(handle, 3)
    assert host.worker.version == 3
    assert isinstance(out, Delivered)  # every part: transfer, handover, pause, bytes
    assert out.nbytes == sum(v.numel() * 2 for v in hf.values())  # bf16 payload
    assert out.pause_seconds > 0  # the first load installs at once (the worker is idle)
    model = host.worker.engine.model.state_dict()
    for k, v in hf.items():
        assert torch.equal(model[k], v.to(model[k].dtype)), k  # bf16 rounding once, as the engine's own cast

    late = RolloutHost(spec_json, 1, threads=1)  # a replacement worker reads the latest handle
    late.update_weights(handle, 3)
    assert late.worker.version == 3
    other = late.worker.engine.model.state_dict()
    assert all(torch.equal(other[k], model[k]) for k in hf)

    slow = Delivered(transfer_seconds=9.0, nbytes=1, handover_seconds=0.0, pause_seconds=0.0)
    parts = sync_report(0.5, [out, None, slow])
    assert parts.transfer_seconds == 9.0 and parts.pause_seconds == out.pause_seconds  # the slowest of each
