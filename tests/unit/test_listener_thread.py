"""A wake-up listener whose subscription is lost tells its node, and again once it is back:
what was announced meanwhile was missed, so the node looks at everything."""

from __future__ import annotations

import threading

from celery_ratchet.domain.job import RESUBSCRIBED_WAKEUP
from celery_ratchet.events import ListenerThread, Wake


class _Flaky(ListenerThread):
    """Subscribes, hears one announcement, loses the connection; three times."""

    def __init__(self) -> None:
        super().__init__()
        self.listens = 0
        self.done = threading.Event()

    def listen(self, wake: Wake) -> None:
        self.listens += 1
        if self.listens == 4:
            self.done.set()
            self._stop.wait()
            return
        self.subscribed(wake)
        wake(f"q{self.listens}")
        raise ConnectionError("server closed the connection unexpectedly")


def test_a_lost_subscription_is_said_when_lost_and_when_back() -> None:
    listener = _Flaky()
    heard: list[str] = []
    listener.start(heard.append)
    try:
        assert listener.done.wait(30)
    finally:
        listener.stop()
    again = RESUBSCRIBED_WAKEUP
    assert heard == ["q1", again, again, "q2", again, again, "q3", again]
    assert listener.live is False
