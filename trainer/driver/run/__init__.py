"""What a run leaves and reads on disk and on the wire: its directory, metrics, checkpoints and faults.

``rundir`` owns the run directory (``metrics.jsonl``, ``summary.json``, the report); ``metrics_log`` reads
``metrics.jsonl`` back typed (the one reader); ``summary`` is the typed run summary and its one serialiser;
``metrics`` is the Prometheus catalogue; ``step_report`` is the typed event of one step; ``checkpoints`` and
``recovery`` are the driver's share of a checkpoint; ``export`` writes the HF folder from a run; ``faults``
turns an error into its one line; ``termination`` is SIGTERM as a request to stop (docs/architecture.md, the
driver).
"""
