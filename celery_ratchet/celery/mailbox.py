"""The sending side of remote control through the store: write a broadcast, gather replies
with the semantics of Celery's mailbox (each reply waited for ``timeout`` seconds at most,
at most ``limit`` replies, ``callback`` called with each as it arrives)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kombu.utils.json import dumps, loads
from kombu.utils.uuid import uuid

from celery_ratchet.errors import ControlCommandRefused
from celery_ratchet.store.control import control_store
from celery_ratchet.store.jobstore import JobStore

#: How long a broadcast stays for the workers when ``control_queue_ttl`` is unset: Celery's
#: default time to live of a control message in a worker's mailbox.
DEFAULT_COMMAND_TTL = 300.0
#: How often the sender looks for replies while it waits.
GATHER_POLL_SECONDS = 0.05


def encode_arguments(command: str, arguments: dict[str, Any]) -> str:
    try:
        return str(dumps(arguments))
    except (TypeError, ValueError) as exc:
        raise ControlCommandRefused(
            f"control command {command!r}: its arguments cannot be sent through the job store "
            f"as JSON ({type(exc).__name__}: {exc}); pass strings, numbers, lists and dicts"
        ) from None


def broadcast_through_store(
    store: JobStore,
    command: str,
    arguments: dict[str, Any],
    *,
    destination: list[str] | None,
    pattern: str | None,
    matcher: str | None,
    reply: bool,
    timeout: float,
    limit: int | None,
    callback: Callable[[Any], object] | None,
    ttl_seconds: float,
    announce: Callable[[], object] | None = None,
) -> list[Any] | None:
    control = control_store(store)
    ticket = uuid() if reply else None
    if limit is None and destination:
        limit = len(destination)
    control.broadcast(
        command,
        encode_arguments(command, arguments),
        destination=str(dumps(destination)) if destination else None,
        pattern=pattern,
        matcher=matcher,
        ticket=ticket,
        ttl_seconds=ttl_seconds,
    )
    if announce is not None:
        announce()
    if ticket is None:
        return None
    try:
        return _gather(control, ticket, timeout, limit, callback)
    finally:
        control.drop_replies(ticket)


def _gather(
    control: Any,
    ticket: str,
    timeout: float,
    limit: int | None,
    callback: Callable[[Any], object] | None,
) -> list[Any]:
    responses: list[Any] = []
    last = 0
    deadline = time.monotonic() + (timeout or 0.0)
    while True:
        found = control.replies(ticket, last)
        for row in found:
            last = row.id
            body = loads(row.reply)
            if callback is not None:
                callback(body)
            responses.append(body)
            if limit and len(responses) >= limit:
                return responses
        now = time.monotonic()
        if found:
            deadline = now + (timeout or 0.0)
        if now >= deadline:
            return responses
        time.sleep(min(GATHER_POLL_SECONDS, deadline - now))
