"""``isinstance`` against a runtime-checkable ``Protocol``, without its per-call cost on the common path.

On Python 3.11 every ``isinstance(obj, P)`` of a ``@runtime_checkable`` protocol walks ``P``'s bases to
list its members (``typing._get_protocol_attrs``), once or twice per call: ~30-60 us, measured in the
rollout worker (``bench/rollout_path.py``), where each episode asks three such questions (is its
environment turn-level, has the user's environment ``truncated_reward``, ``info``). :func:`conforms`
lists the members once per protocol and answers True when ``obj`` has every one of them (a method one
not None) -- the very test ``isinstance`` ends with, so that answer is the same; anything else is left to
``isinstance`` itself.
"""

import functools
import typing


@functools.cache
def _members(proto: type) -> tuple[tuple[str, bool], ...]:
    """``proto``'s protocol members, each with whether ``proto`` defines it as a method (sorted by name)."""
    names = getattr(proto, "__protocol_attrs__", None)  # Python >= 3.12 keeps them on the class
    if names is None:
        names = getattr(typing, "_get_protocol_attrs")(proto)  # noqa: B009  (3.11: private, computed per call)
    return tuple((n, callable(getattr(proto, n, None))) for n in sorted(names))


def conforms(obj: object, proto: type) -> bool:
    """``isinstance(obj, proto)`` for a ``@runtime_checkable`` protocol ``proto`` (a plain ``bool``: mypy takes
    no protocol class for a ``type[T]`` parameter, so callers narrow with ``cast``)."""
    for name, method in _members(proto):
        if not hasattr(obj, name) or (method and getattr(obj, name) is None):
            return isinstance(obj, proto)
    return True


__all__ = ["conforms"]
