"""The training actor: :class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` composes the
megatron-core primitives (``trainer/megatron``) with the old-logit providers (``trainer/oldlogits``); the batch
it trains on is :class:`~asyncrl.trainer.actor.batch.TrainBatch` (the providers read it through their
``PaddedBatch`` protocol).

Direction: ``megatron`` <- ``oldlogits`` <- ``actor`` (neither lower package imports this one).
Submodules import torch and megatron; this package module imports nothing heavy.
"""
