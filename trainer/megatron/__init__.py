"""The megatron-core actor: model construction, per-token log-probs, the HF weight converter and
the training actor. ``compat`` is the only module that knows whether it runs on a GPU or the CPU.

Submodules import torch and megatron; this package module imports nothing heavy.
"""
