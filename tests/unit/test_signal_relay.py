"""A stop signal's handler sets the runtime's events through a thread of their own."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from celery_ratchet.runtime.signal_relay import SignalRelay
from tests.helpers import handler_fired_while_holding


@pytest.fixture
def relay_and_event() -> Iterator[tuple[SignalRelay, threading.Event]]:
    event = threading.Event()
    relay = SignalRelay(event)
    relay.start()
    yield relay, event
    relay.close()


def test_a_pull_sets_the_events_soon(relay_and_event: tuple[SignalRelay, threading.Event]) -> None:
    relay, event = relay_and_event
    relay.pull()
    assert event.wait(10)


def test_a_handler_that_interrupted_the_events_own_set_returns_and_the_event_is_set(
    relay_and_event: tuple[SignalRelay, threading.Event],
) -> None:
    """The deadlock of a cold stop during a warm one: the handler ran while this thread held
    the event's lock, inside ``Event.set()``; setting the event there never returns."""
    relay, event = relay_and_event
    handler_fired_while_holding(event, relay.pull)
    assert event.wait(10)


def test_a_pull_after_close_does_nothing_and_the_pipe_is_closed() -> None:
    event = threading.Event()
    relay = SignalRelay(event)
    relay.start()
    fds = set(os.listdir("/proc/self/fd"))
    relay.close()
    assert event.wait(10)
    event.clear()
    relay.pull()
    assert not relay.running
    thread = relay._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    assert len(set(os.listdir("/proc/self/fd"))) <= len(fds) - 2
    assert not event.is_set()


def test_a_close_with_a_full_pipe_still_ends_the_thread() -> None:
    event = threading.Event()
    relay = SignalRelay(event)
    relay.start()
    for _ in range(100_000):  # far more than a pipe holds, if the thread were slow
        relay.pull()
    relay.close()
    thread = relay._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
