"""The wait of the worker's main loop for its next message (nothing ever arrives): a stop
ends it, whether a stop signal or Celery's own stop flags said so."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from celery.worker import state as worker_state
from kombu import Connection

from celery_ratchet.celery.execution import stopping
from celery_ratchet.celery.worker import transport
from celery_ratchet.celery.worker.transport import Transport, wake


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> Iterator[Connection]:
    # What in-process workers of other tests may have left in this process: Celery's stop
    # flags, and a wake-up not read yet.
    stopping.reset_stop()
    monkeypatch.setattr(worker_state, "should_stop", None)
    monkeypatch.setattr(worker_state, "should_terminate", None)
    with contextlib.suppress(BlockingIOError):
        while os.read(transport._fds()[0], 4096):
            pass
    with Connection(transport=Transport) as conn:
        yield conn
    stopping.reset_stop()


def test_while_the_worker_runs_the_wait_lasts_its_timeout(connection: Connection) -> None:
    with pytest.raises(TimeoutError):
        connection.drain_events(timeout=0.05)


def test_a_wake_up_ends_the_wait(connection: Connection) -> None:
    wake()
    assert connection.drain_events(timeout=30) is None


def test_after_a_stop_signal_no_wait_begins(connection: Connection) -> None:
    stopping.request_stop()
    assert connection.drain_events(timeout=30) is None


@pytest.mark.parametrize("flag", ["should_stop", "should_terminate"])
def test_after_celerys_own_stop_flag_no_wait_begins(
    connection: Connection, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    # celery.contrib.testing.worker.start_worker stops its worker by should_terminate = 0,
    # with no signal; Celery's main loop then waits once more before it ends.
    monkeypatch.setattr(worker_state, flag, 0)
    assert connection.drain_events(timeout=30) is None
