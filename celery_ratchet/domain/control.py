"""Remote control commands (``celery inspect``, ``celery control``) as the store carries them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

#: The wake-up word (in place of a queue name) that says a control command was broadcast.
CONTROL_WAKEUP = "ratchet.control"


@dataclass(frozen=True)
class ControlCommand:
    """One broadcast, as a worker reads it. ``arguments`` and ``destination`` are JSON text,
    decoded by whoever runs the command."""

    id: int
    command: str
    arguments: str
    destination: str | None
    pattern: str | None
    matcher: str | None
    #: Where the replies go; None when the sender wants none.
    ticket: str | None
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class ControlReply:
    """What one node answered, as JSON text of ``{hostname: reply}``."""

    id: int
    hostname: str
    reply: str


def lister_of(job_id: str, queue: str, live_nodes: Mapping[str, Sequence[str]]) -> str | None:
    """The node that lists a job waiting for its due time in ``inspect scheduled``: of the
    live nodes consuming its queue, the one this job ranks first (rendezvous hashing), so
    every node that reads the same nodes picks the same one and a job is listed once.
    ``None`` when no live node consumes the queue."""
    candidates = [node for node, queues in live_nodes.items() if queue in queues]
    if not candidates:
        return None
    return max(candidates, key=lambda node: hashlib.sha256(f"{node}\0{job_id}".encode()).digest())
