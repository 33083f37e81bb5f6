"""The megatron-core primitives: model construction, per-token log-probs, the HF weight converter,
the optimizers and the parallel groups (the checkpoint folder is ``trainer/checkpoint``; the actor that composes
them, its batch record ``TrainBatch`` and its update planning are ``trainer/actor``). ``compat`` is the only
module that knows whether it runs on a GPU or the CPU.

Submodules import torch and megatron; this package module imports nothing heavy.
"""
