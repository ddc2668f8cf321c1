"""Wake-ups over Redis pub/sub (``ratchet_events_url``), for any database."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import redis

from celery_ratchet.events import ListenerThread, Wake

logger = logging.getLogger(__name__)

CHANNEL = "ratchet:jobs"


class RedisWakeups(ListenerThread):
    name = "Redis wake-ups"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self._publisher: RedisPublisher | None = None

    def announce(self, words: Iterable[str]) -> None:
        """Tell the other workers (queues of jobs handed back, say); never raises."""
        if self._publisher is None:
            self._publisher = RedisPublisher(self.url)
        self._publisher.publish(words)

    def listen(self, wake: Wake) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=10)
        pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
        try:
            pubsub.subscribe(CHANNEL)
            self.live = True
            while not self.stopping:
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    data = message["data"]
                    wake(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            pubsub.close()
            client.close()


class RedisPublisher:
    """Tells workers that jobs of some queues were committed. Never fails a send: without
    Redis the workers' polling finds the jobs a little later."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        self._lock = threading.Lock()
        self._last_warning = 0.0

    def publish(self, queues: Iterable[str]) -> None:
        try:
            for queue in set(queues):
                self.client.publish(CHANNEL, queue)
        except redis.RedisError as exc:
            with self._lock:
                now = time.monotonic()
                if now - self._last_warning > 60:
                    self._last_warning = now
                    logger.warning("ratchet: wake-up not published (%s); workers will poll", exc)
