"""Streaming sessions on the reward server: the table a replica keeps them in, and the router that sends
every call of a session to the replica that holds it.

A session is the served reward's own `open_session(...)` object (a `TrainedRewardModel`'s KV cache, a rule
reward's running state), kept on one replica. Its id is `<replica id>.<random hex>`; clients send it in
Serve's session header (`SESSION_HEADER`, `x-session-id` unless $RAY_SERVE_SESSION_ID_HEADER_KEY names
another), and `SessionRouter` routes a request that carries one to the replica the id names.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.constants import SERVE_SESSION_ID as SESSION_HEADER  # what Serve's proxy routes by
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from vlm_rewards.interface import RewardSession

__all__ = ["SESSION_HEADER", "SessionEntry", "SessionRouter", "SessionTable", "SessionsFull", "UnknownSession"]


class UnknownSession(LookupError):
    """No open session has this id on this replica (never opened, closed, or expired)."""


class SessionsFull(RuntimeError):
    """The replica already holds `max_open` sessions."""


def holder_of(session_id: str) -> str:
    """The replica id a session id names."""
    return session_id.rpartition(".")[0]


@dataclass
class SessionEntry:
    """One open session, with what its endpoints need: a lock (one call at a time), when it was last used,
    the frames it received, and the last append's request id and response (a retried append is answered
    from these, so it cannot append its frames twice)."""

    id: str
    session: RewardSession
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    frames_received: int = 0
    last_append: tuple[str | None, dict[str, Any]] | None = None


class SessionTable:
    """A replica's open sessions: at most `max_open`, each dropped (and closed) after `idle_s` unused."""

    def __init__(self, replica: str, max_open: int, idle_s: float, clock: Callable[[], float] = time.monotonic):
        self.replica, self.max_open, self.idle_s, self.clock = replica, max_open, idle_s, clock
        self.entries: OrderedDict[str, SessionEntry] = OrderedDict()  # least recently used first
        self.failures: OrderedDict[str, str] = OrderedDict()  # the last `max_open` failed sessions' errors
        self.counts = {"opened": 0, "closed": 0, "expired": 0, "failed": 0, "refused": 0, "frames_received": 0}

    def open(self, session: RewardSession) -> SessionEntry:
        """Hold `session` under a new id; SessionsFull (the session is closed) if `max_open` are held."""
        self.expire()
        if len(self.entries) >= self.max_open:
            session.close()
            self.counts["refused"] += 1
            raise SessionsFull(
                f"replica {self.replica} already holds {self.max_open} sessions (sessions.max_open); close "
                f"sessions you are done with, or wait for idle ones to expire (sessions.idle_s={self.idle_s})"
            )
        entry = SessionEntry(f"{self.replica}.{uuid.uuid4().hex}", session, self.clock())
        self.entries[entry.id] = entry
        self.counts["opened"] += 1
        return entry

    def get(self, session_id: str) -> SessionEntry:
        """The session `session_id`, marked used now; UnknownSession if this replica holds no such session."""
        self.expire()
        entry = self.entries.get(session_id)
        if session_id in self.failures:
            raise UnknownSession(self.failures[session_id])
        if entry is None:
            raise UnknownSession(
                f"session {session_id!r}: unknown on replica {self.replica} (closed, idle for more than "
                f"sessions.idle_s={self.idle_s} s, or its replica restarted); open a new session"
            )
        entry.last_used = self.clock()
        self.entries.move_to_end(session_id)
        return entry

    def close(self, session_id: str, reason: str = "closed") -> None:
        entry = self.entries.pop(session_id)
        entry.session.close()
        self.counts[reason] += 1

    def fail(self, session_id: str, error: str) -> None:
        """Close a session whose call failed (its state is unknown); later calls for it get `error` (say so)."""
        self.close(session_id, "failed")
        self.failures[session_id] = error
        while len(self.failures) > self.max_open:
            self.failures.popitem(last=False)

    def expire(self) -> None:
        """Close every session unused for more than `idle_s` (and not in a call now)."""
        deadline = self.clock() - self.idle_s
        stale = [e.id for e in self.entries.values() if e.last_used < deadline and not e.lock.locked()]
        for session_id in stale:
            self.close(session_id, "expired")

    def to_json(self) -> dict[str, Any]:
        return {"open": len(self.entries), "max_open": self.max_open, "idle_s": self.idle_s, **self.counts}


class SessionRouter(RequestRouter):
    """Serve request router: a request with a session id goes to the replica the id names (it waits while
    that replica is busy, never goes elsewhere); any other request, or one whose replica is gone (it then
    gets HTTP 404 there), to the less loaded of two random replicas."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        session_id = pending_request.metadata.session_id if pending_request is not None else ""
        if session_id:
            holder = holder_of(session_id)
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == holder:
                    return [[replica]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
