"""The sending side of remote control through the store: write a broadcast, gather replies
with the semantics of Celery's mailbox (each reply waited for ``timeout`` seconds at most,
at most ``limit`` replies, ``callback`` called with each as it arrives)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.utils.json import dumps, loads
from kombu.utils.uuid import uuid

from celery_ratchet.errors import ControlCommandRefused
from celery_ratchet.runtime import control as remote
from celery_ratchet.store.ports import ControlBroadcasts

#: How long a broadcast stays for the workers when ``control_queue_ttl`` is unset: Celery's
#: default time to live of a control message in a worker's mailbox.
DEFAULT_COMMAND_TTL = 300.0


def encode_arguments(command: str, arguments: dict[str, Any]) -> str:
    try:
        return str(dumps(arguments))
    except (TypeError, ValueError) as exc:
        raise ControlCommandRefused(
            f"control command {command!r}: its arguments cannot be sent through the job store "
            f"as JSON ({type(exc).__name__}: {exc}); pass strings, numbers, lists and dicts"
        ) from None


def broadcast_through_store(
    control: ControlBroadcasts,
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
    ticket = uuid() if reply else None
    if limit is None and destination:
        limit = len(destination)
    remote.send(
        control,
        command,
        encode_arguments(command, arguments),
        destination=str(dumps(destination)) if destination else None,
        pattern=pattern,
        matcher=matcher,
        ticket=ticket,
        ttl_seconds=ttl_seconds,
        announce=announce,
    )
    if ticket is None:
        return None
    return remote.gather(
        control, ticket, timeout=timeout, limit=limit, decode=loads, callback=callback
    )
