"""Remote control commands (``celery inspect``, ``celery control``) as the store carries them."""

from __future__ import annotations

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
