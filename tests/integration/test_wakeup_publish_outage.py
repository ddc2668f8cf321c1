"""A wake-up Redis (``ratchet_events_url``) that takes connections and never answers, as a
host dropping packets behind a load balancer does: sends go on without wake-ups after the
first one that timed out, say so once, and publish again once Redis answers."""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from celery import Celery

from celery_ratchet.events import redis as redis_events
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app
from tests.integration.test_wakeups import REDIS, _redis_reachable


class FreezableRedis(socketserver.ThreadingTCPServer):
    """A TCP proxy in front of the test Redis. Frozen, it takes each connection and every
    byte sent on it and answers nothing, for as long as the connection lasts; thawed, new
    connections reach Redis."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.target = target
        self.frozen = True
        #: Connections taken while frozen: one per try (the client drops a connection that
        #: timed out, and its first command on a new one, CLIENT SETINFO, gets no answer).
        self.swallowed = 0
        self.port: int = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Relay(socketserver.BaseRequestHandler):
    server: FreezableRedis

    def handle(self) -> None:
        proxy = self.server
        if proxy.frozen:
            proxy.swallowed += 1
            with contextlib.suppress(OSError):
                while self.request.recv(65536):
                    pass
            return
        with socket.create_connection(proxy.target) as upstream:
            back = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
            back.start()
            _pipe(self.request, upstream)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@dataclass
class Blackholed:
    proxy: FreezableRedis
    #: ``ratchet_events_url`` pointed at the proxy (the test Redis's database).
    events_url: str
    servers: Servers
    broker_trap: BrokerTrap

    def sending_app(self, queue: str) -> Celery:
        url = empty_store(self.servers.url("sqlite")).url
        return make_app(
            url, self.broker_trap.url, ratchet_events_url=self.events_url, task_default_queue=queue
        )


@pytest.fixture
def blackholed(servers: Servers, broker_trap: BrokerTrap) -> Iterator[Blackholed]:
    _redis_reachable()
    host, _, rest = REDIS.partition("//")[2].partition(":")
    port, _, db = rest.partition("/")
    proxy = FreezableRedis((host, int(port)))
    yield Blackholed(proxy, f"redis://127.0.0.1:{proxy.port}/{db}", servers, broker_trap)
    proxy.close()


def test_a_silent_events_redis_costs_one_send_its_timeout_and_one_warning(
    blackholed: Blackholed, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, events_url = blackholed.proxy, blackholed.events_url
    # No try again while the sends run, however slow the machine: each send is counted.
    monkeypatch.setattr(redis_events, "FIRST_PAUSE_SECONDS", 3600.0)
    app = blackholed.sending_app("blackholed")
    add = app.tasks["t.add"]
    with caplog.at_level(logging.DEBUG, logger="celery_ratchet.events.redis"):
        results = [add.delay(i, i) for i in range(20)]
    assert len({r.id for r in results}) == 20
    # The first send waited for Redis until its timeout; the 19 after it did not ask.
    assert proxy.swallowed == 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    # The reason in brackets is redis-py's own words (its releases word it differently).
    (message,) = [r.getMessage() for r in warnings]
    assert message.startswith(f"ratchet: wake-ups not published to {events_url} (Timeout ")
    assert message.endswith(
        "): sends go on without them and workers find new jobs by polling; tried again in the "
        "background, with pauses growing up to 60s"
    )


def test_wake_ups_are_published_again_once_redis_answers(
    blackholed: Blackholed, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, events_url = blackholed.proxy, blackholed.events_url
    monkeypatch.setattr(redis_events, "FIRST_PAUSE_SECONDS", 0.05)
    monkeypatch.setattr(redis_events, "MAX_PAUSE_SECONDS", 0.2)
    queue = f"q-{uuid.uuid4().hex[:8]}"  # the test Redis's channel is shared with others
    app = blackholed.sending_app(queue)
    add = app.tasks["t.add"]
    listener = redis.Redis.from_url(REDIS).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(redis_events.CHANNEL)
    heard: list[str] = []

    def heard_ours() -> bool:
        while (message := listener.get_message(timeout=0.05)) is not None:
            heard.append(message["data"].decode())
        return queue in heard

    try:
        with caplog.at_level(logging.WARNING, logger="celery_ratchet.events.redis"):
            # Sent while Redis is silent, until a try in the background failed as well.
            wait_until(lambda: add.delay(1, 1) and proxy.swallowed >= 2, 60, "a failed retry")
            assert not heard_ours()
            proxy.frozen = False
            wait_until(lambda: add.delay(1, 1) and heard_ours(), 60, "a wake-up published")
    finally:
        listener.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"ratchet: wake-ups not published to {events_url}")
    assert lines[1].startswith(f"ratchet: wake-ups are published to {events_url} again, after")
