"""One agent session: the episode's side and the HTTP side of a conversation, and the table of open sessions.

A session belongs to one episode (one trajectory, or several when the harness branches). Two threads meet
here: the endpoint's event loop (HTTP handlers) and the rollout worker's environment loop (the episode's
``reset``/``step``). They exchange :class:`Event` s through a :class:`Mailbox` (thread-safe, one reader: the
episode) and answer requests through ``concurrent.futures.Future`` s, which either loop can await.

Keys: every session has its own random Bearer key (``sk-asyncrl-...``), never process-global state; a key
names exactly one session, and a finished session's key is kept (so a late request gets 404, not 401).
"""

import asyncio
import concurrent.futures
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.rollout.agent.protocol import ChatRequest, RequestError
from asyncrl.rollout.envs.interface import Message, Sample

EventKind = Literal["request", "end", "fault"]


@dataclass
class Event:
    """What reaches the episode: a chat request (with the future its answer goes to), the end (the reward,
    None = "score with task.reward"), or a fault of the agent (an ``asyncrl_env_errors_total`` reason)."""

    kind: EventKind
    request: ChatRequest | None = None
    messages: list[Message] = field(default_factory=list)  # the request's messages, normal form
    reply: "concurrent.futures.Future[Any] | None" = None
    reward: float | None = None
    reason: str = ""
    message: str = ""


class Mailbox:
    """Events from any thread to one reader (``await get()`` on the reader's loop)."""

    def __init__(self, wake: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self._items: deque[Event] = deque()
        self._waiter: concurrent.futures.Future[Event] | None = None
        self._wake = wake  # set on every put (a worker waiting for any of its sessions to start)

    def put(self, event: Event) -> None:
        with self._lock:
            if self._waiter is not None and not self._waiter.done():
                waiter, self._waiter = self._waiter, None
            else:
                self._items.append(event)
                waiter = None
        if self._wake is not None:
            self._wake.set()
        if waiter is not None:
            waiter.set_result(event)

    def ready(self) -> bool:
        """An event waits to be taken."""
        with self._lock:
            return bool(self._items)

    async def get(self) -> Event:
        with self._lock:
            if self._items:
                return self._items.popleft()
            self._waiter = concurrent.futures.Future()
            waiter = self._waiter
        return await asyncio.wrap_future(waiter)


SessionState = Literal["unclaimed", "open", "finished"]


@dataclass
class AgentSession:
    """One episode's conversation. ``sample`` is what the agent is asked to solve (a dataset row or a seed)."""

    id: str
    key: str
    sample: Sample
    traj_id: str
    state: SessionState = "open"
    mailbox: Mailbox = field(default_factory=Mailbox)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the request being answered (its messages, normal form) and the future its answer goes to
    current: tuple[list[Message], "concurrent.futures.Future[Any]"] | None = None
    # the last answered request's messages and its answer (a retry of it gets the answer replayed)
    answered: tuple[list[Message], Any] | None = None
    claimed: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    requests: int = 0  # chat completions taken (each one sampled turn)
    retries: int = 0  # repeated requests answered with the recorded answer
    aborted: str = ""  # why the session was aborted ("" = it was not): a later request or reward gets 409

    def abort(self, why: str) -> None:
        """Mark the session aborted (the first reason stays): from now on its key is answered 409, never 200."""
        with self.lock:
            self.aborted = self.aborted or why

    def finish(self) -> None:
        """No request is taken any more; a request still waiting gets 404."""
        with self.lock:
            self.state = "finished"
            cur, self.current = self.current, None
        if cur is not None and not cur[1].done():
            cur[1].set_exception(RequestError(404, f"session {self.id} has ended", code="session_finished"))


class SessionTable:
    """The worker's sessions by key and by id; external sessions wait here (``unclaimed``) until a harness opens one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.wake = threading.Event()  # set whenever any session gets an event
        self._by_key: dict[str, AgentSession] = {}
        self._by_id: dict[str, AgentSession] = {}
        self._unclaimed: deque[AgentSession] = deque()
        self._n = 0

    def open(self, sample: Sample, traj_id: str, *, external: bool) -> AgentSession:
        with self._lock:
            self._n += 1
            s = AgentSession(id=f"sess-{self._n}-{secrets.token_hex(4)}", key=f"sk-asyncrl-{secrets.token_urlsafe(24)}",
                             sample=dict(sample), traj_id=traj_id, state="unclaimed" if external else "open",
                             mailbox=Mailbox(self.wake))
            self._by_key[s.key], self._by_id[s.id] = s, s
            if external:
                self._unclaimed.append(s)
            return s

    def claim(self) -> AgentSession | None:
        """The oldest session waiting for an external harness (now open), or None."""
        with self._lock:
            while self._unclaimed:
                s = self._unclaimed.popleft()
                if s.state == "unclaimed":
                    s.state = "open"
                    s.claimed.set_result(None)
                    return s
            return None

    def by_key(self, key: str) -> AgentSession:
        """The session of a Bearer key; ``RequestError`` 401 (unknown key), 409 (the session was aborted) or 404
        (the session has ended)."""
        with self._lock:
            s = self._by_key.get(key)
        if s is None:
            raise RequestError(401, "unknown API key: use the key of an open session (POST /v1/sessions, or the "
                               "client asyncrl hands the agent function)", type_="authentication_error",
                               code="invalid_api_key")
        if s.aborted:
            raise RequestError(409, f"session {s.id} was aborted ({s.aborted[:200]}); its reward and requests are "
                               "no longer taken", code="session_aborted")
        if s.state == "finished":
            raise RequestError(404, f"session {s.id} has ended", code="session_finished")
        return s

    def get(self, key: str) -> AgentSession | None:
        """The session of ``key`` whatever its state (open, aborted, or ended and still remembered), or None."""
        with self._lock:
            return self._by_key.get(key)

    def by_id(self, sid: str) -> AgentSession | None:
        with self._lock:
            return self._by_id.get(sid)

    def close(self, s: AgentSession) -> None:
        """Finish ``s`` and forget it after a while: its key keeps answering 404 (a bounded memory of ended keys)."""
        s.finish()
        with self._lock:
            ended = [k for k, v in self._by_key.items() if v.state == "finished"]
            for k in ended[: max(0, len(ended) - 4096)]:
                v = self._by_key.pop(k)
                self._by_id.pop(v.id, None)

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(s.state == "unclaimed" for s in self._unclaimed)


__all__ = ["AgentSession", "Event", "Mailbox", "SessionTable"]
