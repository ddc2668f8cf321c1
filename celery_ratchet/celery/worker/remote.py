"""A worker's remote control without a broker: commands broadcast through the store are run
by Celery's own control handlers (``celery.worker.control.Panel``) on the consumer's main
loop, where a worker's mailbox runs them, so their replies are stock Celery's."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery.utils.collections import AttributeDict
from celery.utils.functional import pass1
from celery.worker.control import Panel
from kombu.matcher import match
from kombu.utils.json import dumps, loads

from celery_ratchet.celery.execution.capacity import capacity_for
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.celery.worker.scheduled import scheduled
from celery_ratchet.celery.worker.transport import wake as wake_main_loop
from celery_ratchet.domain.control import ControlCommand

logger = logging.getLogger(__name__)

#: Longest wait for the main loop to run a command; a worker that is stopping runs none.
MAIN_LOOP_WAIT_SECONDS = 10.0


def addressed_to(hostname: str, command: ControlCommand) -> bool:
    """Whether ``command`` is for the node ``hostname``: its destination list names it,
    its pattern matches it, or it names no node (every worker)."""
    if command.destination:
        destination = loads(command.destination)
        if destination:
            return hostname in destination
    if command.pattern and command.matcher:
        return bool(match(hostname.encode(), command.pattern.encode(), command.matcher))
    return True


#: Commands that change the queues a worker consumes from (Celery applies them on its loop).
_QUEUE_COMMANDS = frozenset({"add_consumer", "cancel_consumer"})


#: Celery's listing of the ETA tasks a worker holds (and its alias).
_SCHEDULED_COMMANDS = frozenset({"scheduled", "dump_schedule"})

#: Commands that change how many jobs the pool runs at once.
_POOL_COMMANDS = frozenset({"pool_grow", "pool_shrink"})


class _Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: Any = None
        self.shutdown = False


class RemoteCommands:
    """Runs the commands addressed to this worker; returns replies as ``{hostname: reply}``
    JSON text."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.hostname = consumer.hostname
        # What a worker's mailbox gives Celery's handlers.
        self.state = AttributeDict(
            app=consumer.app,
            hostname=consumer.hostname,
            consumer=consumer,
            tset=pass1 if consumer.controller.use_eventloop else set,
        )

    def __call__(self, command: ControlCommand) -> str | None:
        if not addressed_to(self.hostname, command):
            return None
        arguments = loads(command.arguments) or {}
        outcome = _Outcome()
        self.consumer.call_soon(self._run, command.command, arguments, outcome)
        wake_main_loop()
        if not outcome.done.wait(MAIN_LOOP_WAIT_SECONDS):
            logger.warning(
                "ratchet: control command %r not run: the worker's main loop did not take it "
                "within %ss",
                command.command,
                MAIN_LOOP_WAIT_SECONDS,
            )
            return None
        if outcome.shutdown or command.ticket is None:
            return None
        return str(dumps({self.hostname: outcome.reply}))

    def _run(self, name: str, arguments: dict[str, Any], outcome: _Outcome) -> None:
        """On the consumer's main loop, as a worker's mailbox dispatches a command: an error
        is replied as ``{"error": repr(exc)}``; a shutdown replies nothing and stops the
        worker."""
        self.consumer.app.clock.forward()
        try:
            if name in _SCHEDULED_COMMANDS:  # ETA jobs wait in the store, not in the timer
                outcome.reply = scheduled(self.consumer)
            else:
                outcome.reply = Panel.data[name](self.state, **arguments)
            if name in _QUEUE_COMMANDS:
                # Celery's handler queued its change of queues; make it now, then claim from
                # the result (the queue is a stack on Celery 5.5, first-in-first-out later).
                self.consumer.perform_pending_operations()
                self._claim_from_consumed_queues()
            elif name in _POOL_COMMANDS:
                self._take_as_many_as_the_pool_runs()
        except SystemExit:
            outcome.shutdown = True
            raise
        except Exception as exc:
            logger.error("ratchet: control command %r failed: %r", name, exc, exc_info=True)
            outcome.reply = {"error": repr(exc)}
        finally:
            outcome.done.set()

    def _claim_from_consumed_queues(self) -> None:
        """The node claims from the queues Celery now consumes from."""
        runtime = ratchet_state(self.consumer.app).runtime
        if runtime is not None:
            runtime.set_queues(sorted(self.consumer.app.amqp.queues.consume_from))

    def _take_as_many_as_the_pool_runs(self) -> None:
        """The node claims for the pool's processes now, not those it started with."""
        runtime = ratchet_state(self.consumer.app).runtime
        processes = getattr(self.consumer.pool, "num_processes", None)
        if runtime is not None and isinstance(processes, int) and processes > 0:
            runtime.set_capacity(capacity_for(self.consumer, processes))
