"""Wake-ups over Redis pub/sub (``ratchet_events_url``), for any database."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable

import redis

from celery_ratchet.events import ListenerThread, Wake
from celery_ratchet.settings import mask_password
from celery_ratchet.threads import background_thread

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
            self.subscribed(wake)
            while not self.stopping:
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    data = message["data"]
                    wake(data.decode() if isinstance(data, bytes) else str(data))
        finally:
            pubsub.close()
            client.close()


#: After a publish fails, none is tried for this long; each failed try after that doubles
#: the pause, up to the cap. Meanwhile sends go on without wake-ups (workers poll).
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 60.0


class RedisPublisher:
    """Tells workers that jobs of some queues were committed. Never fails a send: without
    Redis the workers' polling finds the jobs a little later.

    A Redis that does not answer (a host that drops packets) would cost every send the
    client's timeout: after a failure, publishing stops for a pause that grows while Redis
    stays away; a thread of its own tries again at the end of each pause, so no send waits
    on it, and publishing resumes once a try gets through."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._pause = 0.0
        self._resume_at = 0.0
        #: The process whose thread is trying Redis again (a forked child has no such thread).
        self._trying_in: int | None = None

    def publish(self, queues: Iterable[str]) -> None:
        with self._lock:
            if self._down_since is not None:
                if time.monotonic() >= self._resume_at and self._trying_in != os.getpid():
                    self._trying_in = os.getpid()
                    background_thread(
                        self._try_again, "ratchet-wakeup-retry", args=(sorted(set(queues)),)
                    ).start()
                return
        try:
            self._send(queues)
        except redis.RedisError as exc:
            self._failed(exc)

    def _send(self, queues: Iterable[str]) -> None:
        for queue in set(queues):
            self.client.publish(CHANNEL, queue)

    def _try_again(self, queues: list[str]) -> None:
        try:
            self._send(queues)
        except redis.RedisError as exc:
            self._failed(exc)
        else:
            with self._lock:
                since, self._down_since = self._down_since, None
            if since is not None:
                logger.warning(
                    "ratchet: wake-ups are published to %s again, after %.1fs",
                    mask_password(self.url, whole=True),
                    time.monotonic() - since,
                )
        finally:
            with self._lock:
                self._trying_in = None

    def _failed(self, exc: redis.RedisError) -> None:
        with self._lock:
            now = time.monotonic()
            first = self._down_since is None
            if first:
                self._down_since, self._pause = now, FIRST_PAUSE_SECONDS
            else:
                self._pause = min(self._pause * 2, MAX_PAUSE_SECONDS)
            self._resume_at = now + self._pause
        if first:
            logger.warning(
                "ratchet: wake-ups not published to %s (%s): sends go on without them and "
                "workers find new jobs by polling; tried again in the background, with "
                "pauses growing up to %.0fs",
                mask_password(self.url, whole=True),
                exc,
                MAX_PAUSE_SECONDS,
            )
        else:
            logger.debug("ratchet: wake-ups still not published (%s)", exc)
