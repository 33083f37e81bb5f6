"""The trainer: correction math, reference policies, the Megatron actor, old-logit strategies and
the job driver. Submodules import torch lazily where the CLI needs to stay light."""
