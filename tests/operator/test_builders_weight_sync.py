"""``actor.weightSync.transport: disk`` in a cluster: the rollout and old-logit pods mount the checkpoint
volume (they read the versions from it), and only the driver and the actor treat it as the checkpoint folder."""

from tests.operator.test_builders import build, container, env_of


def _mounts_checkpoints(d: object, pod: str) -> bool:
    spec = d.pods[pod].manifest["spec"]  # type: ignore[attr-defined]
    return any(v["name"] == "checkpoints" for v in spec["volumes"])


def test_disk_transport_mounts_the_checkpoint_volume_on_the_receivers() -> None:
    d = build(checkpoint={"volumeClaimName": "ckpt"}, actor={"weightSync": {"transport": "disk"}},
              correction={"reference": "exact"}, oldLogits={"strategy": "dedicated"})
    for pod in ("j-driver-0", "j-actor-0", "j-rollout-0", "j-oldlogit-0"):
        assert _mounts_checkpoints(d, pod), pod
    assert "ASYNCRL_CHECKPOINT_DIR" not in env_of(container(d, "j-rollout-0"))  # a reader, not the checkpoint dir
    other = build(checkpoint={"volumeClaimName": "ckpt"}, actor={"weightSync": {"transport": "broadcast"}})
    assert not _mounts_checkpoints(other, "j-rollout-0")
