"""Asking the workers, through the store, what Flower asks them through the broker: each
command is a broadcast that the addressed workers run with Celery's own remote control
handlers (``celery inspect`` / ``celery control``), their replies gathered here. JSON on
both ends: the worker replies with kombu's JSON, whose tagged values (a datetime, say) are
shown as the text they carry."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from celery_ratchet.runtime import control as remote
from celery_ratchet.store.read_ports import DashboardStore
from celery_ratchet.web.guard import ReadOnlyMode

#: How long a command waits for a worker (each reply); a broadcast stays this long too.
REPLY_SECONDS = 2.0
TTL_SECONDS = 30.0


def _untagged(value: dict[str, Any]) -> Any:
    """kombu's ``{"__type__": ..., "__value__": ...}`` as its value."""
    if set(value) == {"__type__", "__value__"}:
        return value["__value__"]
    return value


def decode(text: str) -> Any:
    return json.loads(text, object_hook=_untagged)


class Workers:
    def __init__(
        self, store: DashboardStore, *, timeout: float = REPLY_SECONDS, read_only: bool = False
    ) -> None:
        """``read_only``: ask nothing (each command is a control row written to the store)."""
        self.store = store
        self.timeout = timeout
        self.read_only = read_only

    def _send(self, command: str, arguments: dict[str, Any], destination: Sequence[str]) -> str:
        if self.read_only:
            raise ReadOnlyMode(
                f"asking a worker ({command}: a worker's page asks it for its pool and "
                "tasks) writes a control row to the job store; the Workers page shows what "
                "the store holds of each"
            )
        ticket = uuid.uuid4().hex
        remote.send(
            self.store.control,
            command,
            json.dumps(arguments),
            destination=json.dumps(list(destination)) if destination else None,
            ticket=ticket,
            ttl_seconds=TTL_SECONDS,
        )
        return ticket

    def _gather(
        self, ticket: str, limit: int | None, timeout: float | None = None
    ) -> dict[str, Any]:
        replies: dict[str, Any] = {}
        waited = self.timeout if timeout is None else timeout
        for body in remote.gather(
            self.store.control, ticket, timeout=waited, limit=limit, decode=decode
        ):
            if isinstance(body, dict):
                replies.update(body)
        return replies

    def command(
        self, command: str, arguments: dict[str, Any], destination: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Run ``command`` on the workers named (every live one when none is), and return
        their replies by worker name: those that answered within the timeout."""
        limit = len(destination) or len(self.store.list_nodes()) or None
        return self._gather(self._send(command, arguments, destination), limit)

    def inspect(self, hostname: str) -> dict[str, Any]:
        """What one worker says of itself (``stats``: its pool and what it ran; and the
        task names it has registered), both asked at once; empty when it did not answer."""
        tickets = {name: self._send(name, {}, [hostname]) for name in ("stats", "registered")}
        found: dict[str, Any] = {}
        timeout = self.timeout
        for name, ticket in tickets.items():
            found[name] = self._gather(ticket, 1, timeout).get(hostname)
            if found[name] is None:  # not answering: its second reply is not waited for
                timeout = 0.0
        return found
