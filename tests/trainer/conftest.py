"""Fixtures of the trainer's tests."""

import pytest


@pytest.fixture(scope="module")
def megatron_on_cpu() -> None:
    """megatron-core set up on the CPU shim, seeded, once per module that asks for it (``pytestmark``). The CPU
    suite stays on the shim even on a CUDA host: megatron's setup is per process."""
    from asyncrl.trainer.megatron import compat

    compat.init_megatron(seed=0, device="cpu")
