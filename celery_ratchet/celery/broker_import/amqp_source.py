"""The messages of RabbitMQ queues (AMQP 0.9.1, through kombu).

Each message is taken with ``basic.get`` without acknowledging it, and acknowledged only once
its job is committed: a run cut off (its connection gone) leaves every message it had not
acknowledged back in its queue, where the next run finds it (moved: then present). Refused
messages are held unacknowledged until the run ends, then go back to their queue.

What it cannot do: a message a live consumer holds unacknowledged (a running Celery worker's
prefetched and ETA tasks) is not in the queue for anyone else until that consumer acknowledges,
rejects or disconnects; such a queue's consumers are named in the run's notes. Chords are
moved from Redis only (their size and progress are in the result backend).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from kombu.connection import Connection
from kombu.entity import Queue

from celery_ratchet.celery.broker_import.convert import BrokerMessage, Decode
from celery_ratchet.celery.broker_import.mover import Item


class AmqpSource:
    def __init__(
        self, url: str, queues: Sequence[str], transport_options: dict[str, Any] | None = None
    ) -> None:
        self.connection = Connection(url, transport_options=transport_options or {})
        self.channel: Any = self.connection.channel()
        self.queues = list(dict.fromkeys(queues))
        #: What the run could not move, said once at its end.
        self.notes: list[str] = []
        self._held: list[Any] = []

    def chord_members(self, decode: Decode) -> dict[str, int] | None:
        return None  # counted only by taking every message: chords are refused here

    def _count(self, queue: str) -> tuple[int, int]:
        """Messages ready in ``queue``, and consumers attached to it (0, 0 when it is not
        there: a passive declare of a missing queue closes the channel, so it is reopened)."""
        try:
            _, ready, consumers = self.channel.queue_declare(queue=queue, passive=True)
        except self.connection.channel_errors:
            self.channel = self.connection.channel()
            self.notes.append(f"{queue}: no such queue on the broker")
            return 0, 0
        return int(ready), int(consumers)

    def batches(self, size: int, dry_run: bool) -> Iterator[list[Item]]:
        for name in self.queues:
            ready, consumers = self._count(name)
            if consumers:
                self.notes.append(
                    f"{name}: {consumers} consumers are attached; the messages they hold "
                    "unacknowledged (ETA tasks among them) are not in the queue to move: stop "
                    "them and run again"
                )
            queue = Queue(name, channel=self.channel, no_declare=True)
            taken = 0
            while taken < ready:  # only what it held at the start: no new arrival, no return
                batch: list[Item] = []
                while len(batch) < size and taken < ready:
                    message = queue.get(no_ack=False, accept=None)
                    if message is None:
                        break
                    taken += 1
                    batch.append(Item(message, name, _broker_message(message, name)))
                if not batch:
                    break
                yield batch
                if dry_run:  # read, never acknowledged: back in the queue when the run ends
                    self._held.extend(item.handle for item in batch)

    def settle(self, batch: Sequence[Item], refused: Sequence[Item]) -> None:
        given_back = {id(item) for item in refused}
        for item in batch:
            if id(item) in given_back:
                self._held.append(item.handle)
            else:
                item.handle.ack()

    def close(self) -> None:
        """Closing the channel gives back every message it holds unacknowledged."""
        try:
            self.channel.close()
        finally:
            self.connection.release()


def _broker_message(message: Any, queue: str) -> BrokerMessage:
    body = message.body
    return BrokerMessage(
        body=body if isinstance(body, bytes) else str(body).encode(),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=dict(message.headers or {}),
        properties=dict(message.properties or {}),
        queue=queue,
    )
