"""The job driver, by role: ``loop/`` (the training loop and its stages), ``hosts/`` (the Ray processes),
``run/`` (the run directory, metrics, checkpoints, faults) and ``status/`` (what the driver reports).

``loop.training_loop.run_job`` is the entry point (``asyncrl run``); the dependency direction inside is
``run`` <- ``hosts`` <- ``loop`` and ``run`` <- ``status`` (docs/architecture.md, the path of one token).
"""
