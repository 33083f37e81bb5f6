"""The job's status as the driver reports it: the wire format, the reporter, and the relay sidecar.

``api`` is the typed status the driver sends; ``reporter`` sends it from the loop; ``relay`` (its decisions and the
driver's side) and ``relay_server`` (the socket) are the sidecar that holds the status token and patches the
AsyncRLJob with the registered driver's reports only (docs/architecture.md, the driver; docs/security.md).
"""
