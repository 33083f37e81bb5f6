"""The job's Ray processes: the actor ranks' host, the rollout workers' host, their fleet and Ray itself.

``fleet.start_hosts`` starts them (``HostHandles``); ``actor_host`` and ``rollout_host`` are the Ray actors;
``actor_group`` keeps the actor ranks one gang; ``ray_env`` starts or joins Ray; ``warm_start`` is the
supervised warm start's schedule; ``common`` is what every host shares (docs/architecture.md, the driver).
"""
