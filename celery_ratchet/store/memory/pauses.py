"""The in-memory store's paused queues (``ratchet queues pause``)."""

from __future__ import annotations

from celery_ratchet.domain.queue_pause import PausedQueue, checked_name, checked_reason
from celery_ratchet.store.memory.state import MemoryState


class PauseRows:
    """Paused queues: pause, resume, list."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def pause_queue(self, queue: str, reason: str | None = None) -> bool:
        queue, reason = checked_name(queue), checked_reason(reason)
        with self.state.lock:
            paused = self.state.t.paused
            if queue in paused:
                return False
            paused[queue] = PausedQueue(queue, self.state.now(), reason)
            return True

    def resume_queue(self, queue: str) -> bool:
        queue = checked_name(queue)
        with self.state.lock:
            if self.state.t.paused.pop(queue, None) is None:
                return False
            self.state.announced.append(queue)
            return True

    def paused_queues(self) -> dict[str, PausedQueue]:
        with self.state.lock:
            return dict(sorted(self.state.t.paused.items()))
