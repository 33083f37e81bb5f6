"""The job driver: staleness buffer, batch assembly, metrics, run directory and the Ray loop.

``loop.run_job`` is the entry point (``asyncrl run``); the other modules are pure parts it wires
together (docs/architecture.md, the path of one token).
"""
