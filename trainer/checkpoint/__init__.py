"""The checkpoint folder: one format, read as data, written atomically.

``folder`` seals and verifies a folder (every file listed in ``meta.json`` with its size and SHA-256, written
to a temporary sibling and renamed); ``sharded`` writes and reads the actor's state as torch distributed
checkpoint shards, one per rank, and merges them across layouts; ``safe_load`` is the only reader of a
folder's bytes (a restricted unpickler: a folder is data, never code). Who checkpoints what sits with its
owner: the actor's weights and optimizer in ``trainer/actor/checkpoint_io.py``, the driver's own state and
the choice of folder in ``trainer/driver/run/checkpoints.py`` and ``recovery.py`` (docs/architecture.md).
"""
