"""The key an external harness sends to take a session (``POST /v1/sessions``), read once when a worker starts.

Where it comes from: ``$ASYNCRL_AGENT_SESSION_KEY``. In a cluster the operator sets it in every rollout pod of an
external agent from ``spec.task.endpoint.sessionKeyFrom``, else from the Secret ``<job>-agent-key`` it makes
(``operator/agent_endpoint.py``), so a cluster's endpoint always has one. A local run (``asyncrl run``) reads it
from the environment it was started in.

The rules, checked by ``asyncrl run`` before Ray starts and by every worker at start (:func:`session_key`):

- a value that is empty, or starts or ends with whitespace, is refused: an empty value used to turn the check off,
  and a Secret made from a file (``kubectl create secret --from-file``) keeps the file's trailing newline, which
  no harness sends, so every harness was locked out (401) with nothing saying why;
- ``sessionKeyFrom`` in the spec with the variable unset is refused (locally: export it), never served open;
- without a key the endpoint may listen on loopback only (a local run: other users of the machine can reach it,
  the same boundary as the run's Ray, ``docs/security.md``); a non-loopback bind (``$ASYNCRL_AGENT_BIND``)
  without a key is refused.

The value is never shown: errors name the variable and the Secret, not what they hold.
"""

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from asyncrl.api.constants import AGENT_BIND_ENV, AGENT_SESSION_KEY_ENV
from asyncrl.rollout.envs.binding import EnvLoadError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SessionKeyError(EnvLoadError):
    """The session key cannot be used as configured: a permanent failure at start (exit code 2 locally)."""


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def session_key(environ: Mapping[str, str], *, external: bool, bind_host: str, key_from: Any = None) -> str | None:
    """The key ``POST /v1/sessions`` must carry (None: none), or :class:`SessionKeyError` naming the variable, the
    rule and the fix (never the value).

    ``external``: ``spec.task.agent: external`` (an in-process agent's sessions are never taken over HTTP: None);
    ``bind_host``: where the endpoint listens; ``key_from``: ``spec.task.endpoint.sessionKeyFrom`` (a
    ``SecretKeyRef`` or None)."""
    if not external:
        return None
    raw = environ.get(AGENT_SESSION_KEY_ENV)
    where = (f"Secret {key_from.name!r} key {key_from.key!r} (spec.task.endpoint.sessionKeyFrom)" if key_from is not None
             else "the operator's Secret <job>-agent-key in a cluster")
    if raw is None:
        if key_from is not None:
            raise SessionKeyError(
                f"spec.task.endpoint.sessionKeyFrom names {where}, but ${AGENT_SESSION_KEY_ENV} is not set: in a "
                f"cluster the operator sets it from that Secret; for a local run export {AGENT_SESSION_KEY_ENV} "
                "with the key a harness will send (taking sessions is never left open when the spec asks for a key)")
        if not is_loopback(bind_host):
            raise SessionKeyError(
                f"the agent endpoint would listen on {bind_host} (${AGENT_BIND_ENV}) with no session key: anyone who "
                f"reaches that address could take sessions; set {AGENT_SESSION_KEY_ENV} (or spec.task.endpoint."
                "sessionKeyFrom), or listen on loopback (unset ASYNCRL_AGENT_BIND)")
        return None
    if not raw.strip():
        raise SessionKeyError(
            f"${AGENT_SESSION_KEY_ENV} (from {where}) is empty: an empty key would turn the check off; put a random "
            "value of 32 or more characters there, e.g. `openssl rand -base64 24`")
    if raw.strip() != raw or _CONTROL.search(raw):
        raise SessionKeyError(
            f"${AGENT_SESSION_KEY_ENV} (from {where}) starts or ends with whitespace or holds a control character "
            "(not shown): no harness sends those, so every one would be refused (401); a Secret made with "
            "--from-file keeps the file's trailing newline: make it with `kubectl create secret generic <name> "
            "--from-literal=<key>=<value>` or write the file with `printf %s`")
    return raw


__all__ = ["SessionKeyError", "is_loopback", "session_key"]
