"""One job's training loop: the stages that move a token from rollout to the actor and weights back.

``training_loop.run_job`` is the entry point (``asyncrl run``, ``asyncrl driver``), inside the scopes of
``run_scope`` (each with its cleanup); ``view`` is what the stages see of the running loop; ``staleness`` and
``grpo_batch`` are the pure buffer and batch assembly; ``stage`` is what an old-logit stage is to the loop,
``stages`` and ``dedicated_stage`` obtain the old logits per route and ``stage_registry`` picks one;
``workers`` keeps each rollout worker's slot (idle, or its call in flight); ``weight_sync`` delivers a version
to the rollout workers; ``accounting`` and ``evaluation`` count; ``startup_probe`` checks ``mu`` before the
first step; ``gang_restart`` reruns the loop when the actor gang fails (docs/architecture.md, the driver).
"""
