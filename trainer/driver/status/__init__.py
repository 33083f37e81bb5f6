"""The job's status as the driver reports it: the wire format, the reporter, and the relay sidecar.

``api`` is the typed status the driver sends; ``reporter`` sends it from the loop; ``relay`` is the sidecar
that holds the status token and patches the AsyncRLJob (docs/architecture.md, the driver; docs/security.md).
"""
