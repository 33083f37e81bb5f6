"""The megatron-core primitives: model construction, per-token log-probs, the HF weight converter,
the optimizers and the parallel groups (the checkpoint folder is ``trainer/checkpoint``) (the actor that composes them, and plans its updates,
is ``trainer/actor``). :mod:`.batch` holds ``TrainBatch``, the record the old-logit providers and the
actor both take, so it sits below both. ``compat`` is the only module that knows whether it runs on a
GPU or the CPU.

Submodules import torch and megatron; this package module imports nothing heavy.
"""
