"""The megatron-core primitives: model construction, per-token log-probs, the HF weight converter,
the update step's pure parts and the parallel groups (the actor that composes them is
``trainer/actor``). ``compat`` is the only module that knows whether it runs on a GPU or the CPU.

Submodules import torch and megatron; this package module imports nothing heavy.
"""
