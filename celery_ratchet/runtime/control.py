"""Remote control through the store: the worker side (read the broadcasts addressed to this
node, have them run, write the replies) and the sender's (write a broadcast, gather its
replies), whichever codec each end uses."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery_ratchet.domain.control import ControlCommand
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.runtime.clock import SYSTEM_CLOCK, Clock
from celery_ratchet.store.ports import ControlBroadcasts, ControlCommands
from celery_ratchet.threads import background_thread

logger = logging.getLogger(__name__)

#: How often the sender looks for replies while it waits.
GATHER_POLL_SECONDS = 0.05

#: Runs one command; returns the reply as JSON text, or None for no reply (the command is
#: not for this node, the sender wants none, or the node is shutting down).
CommandRunner = Callable[[ControlCommand], "str | None"]


class ControlLoop:
    """A thread that looks for broadcasts when told (:meth:`hint`) or every poll interval,
    runs each new one once through ``run`` and writes its reply."""

    def __init__(
        self,
        control: ControlCommands,
        run: CommandRunner,
        *,
        hostname: str,
        poll_seconds: Callable[[], float],
    ) -> None:
        self.control = control
        self.run = run
        self.hostname = hostname
        self.poll_seconds = poll_seconds
        self._hint = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self, since: datetime) -> None:
        """Start reading the commands broadcast from ``since`` on (by the database clock:
        the node's registration). A node that starts later than a broadcast does not run
        it, as a worker's mailbox would not receive it."""
        self._thread = background_thread(self._loop, "ratchet-control", args=(since,))
        self._thread.start()

    def hint(self) -> None:
        """A command was broadcast: look now."""
        self._hint.set()

    def close(self, timeout: float = 5.0) -> None:
        self._closed.set()
        self._hint.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _wait(self) -> None:
        self._hint.wait(self.poll_seconds())
        self._hint.clear()

    def _loop(self, since: datetime) -> None:
        handled: set[int] = set()
        while not self._closed.is_set():
            try:
                commands = self.control.commands_since(since)
                self._problem_ended()
            except Exception as exc:
                self._problem(exc)
                self._wait()
                continue
            for command in commands:
                if command.id in handled or self._closed.is_set():
                    continue
                handled.add(command.id)
                self._handle(command)
            handled &= {command.id for command in commands}
            self._wait()

    def _handle(self, command: ControlCommand) -> None:
        try:
            reply = self.run(command)
        except Exception:
            logger.exception("ratchet: control command %r failed", command.command)
            return
        if reply is None or command.ticket is None:
            return
        try:
            self.control.reply(command, self.hostname, reply)
        except Exception as exc:
            logger.warning("ratchet: reply to control command %r not written: %s",
                           command.command, exc)  # fmt: skip

    def _problem(self, exc: Exception) -> None:
        if not self._warned and not isinstance(exc, StoreUnavailable):
            logger.warning("ratchet: control commands not read: %s", exc)
        self._warned = True

    def _problem_ended(self) -> None:
        self._warned = False


def send(
    control: ControlBroadcasts,
    command: str,
    arguments: str,
    *,
    destination: str | None,
    ticket: str | None,
    ttl_seconds: float,
    pattern: str | None = None,
    matcher: str | None = None,
    announce: Callable[[], object] | None = None,
) -> None:
    """Write one broadcast (``arguments`` and ``destination`` as JSON text); the nodes
    that read it reply under ``ticket`` when it is given."""
    control.broadcast(
        command,
        arguments,
        destination=destination,
        pattern=pattern,
        matcher=matcher,
        ticket=ticket,
        ttl_seconds=ttl_seconds,
    )
    if announce is not None:
        announce()


def gather(
    control: ControlBroadcasts,
    ticket: str,
    *,
    timeout: float,
    limit: int | None,
    decode: Callable[[str], Any],
    callback: Callable[[Any], object] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> list[Any]:
    """The replies to ``ticket`` as Celery's mailbox gathers them: each waited for
    ``timeout`` seconds at most, at most ``limit`` of them, ``callback`` called with each as
    it arrives; the replies are deleted once gathered."""
    responses: list[Any] = []
    last = 0
    deadline = clock.monotonic() + (timeout or 0.0)
    try:
        while True:
            found = control.replies(ticket, last)
            for row in found:
                last = row.id
                body = decode(row.reply)
                if callback is not None:
                    callback(body)
                responses.append(body)
                if limit and len(responses) >= limit:
                    return responses
            now = clock.monotonic()
            if found:
                deadline = now + (timeout or 0.0)
            if now >= deadline:
                return responses
            clock.sleep(min(GATHER_POLL_SECONDS, deadline - now))
    finally:
        control.drop_replies(ticket)
