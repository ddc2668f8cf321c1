"""Paused queues: which of a worker's queues it may claim from, and what a pause may say."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from celery_ratchet.domain.job import SCHEDULES_QUEUE
from celery_ratchet.errors import InvalidArgument

#: The longest queue name and pause reason the store holds (characters).
NAME_LIMIT = 255
REASON_LIMIT = 255


@dataclass(frozen=True)
class PausedQueue:
    queue: str
    paused_at: datetime
    #: Who paused it and why, as given; None when not said.
    reason: str | None


def claimable(queues: Sequence[str], paused: Collection[str]) -> list[str]:
    """The queues to claim from, in the worker's order: its own less the paused ones."""
    return [q for q in queues if q not in paused]


def checked_name(queue: object) -> str:
    """``queue`` as a queue name the pause table holds, or InvalidArgument saying why not."""
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidArgument("queue", "a queue name is a non-empty string")
    if queue == SCHEDULES_QUEUE:
        raise InvalidArgument(
            "queue",
            f"{SCHEDULES_QUEUE} holds the recurring schedules, not jobs: pause a schedule "
            "with `ratchet schedules pause KEY`",
        )
    if queue != queue.strip():
        raise InvalidArgument(
            "queue",
            "the queue name starts or ends with white space, which no worker's queue does "
            "(MariaDB would also take it for the name without it)",
        )
    return _checked("queue", queue, NAME_LIMIT)


def checked_reason(reason: object) -> str | None:
    if reason is None or reason == "":
        return None
    if not isinstance(reason, str):
        raise InvalidArgument("reason", "a pause's reason is a string")
    return _checked("reason", reason, REASON_LIMIT)


def _checked(field: str, value: str, limit: int) -> str:
    if "\x00" in value:
        raise InvalidArgument(field, f"the {field} holds a NUL character, which no database keeps")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(
            field, f"the {field} holds a lone surrogate, which is no text a database keeps"
        ) from None
    if len(value) > limit:
        raise InvalidArgument(
            field, f"the {field} is {len(value)} characters long; at most {limit} are kept"
        )
    return value
