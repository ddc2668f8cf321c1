"""Wake-ups over PostgreSQL LISTEN/NOTIFY: no Redis needed."""

from __future__ import annotations

import psycopg

from celery_ratchet.events import ListenerThread, Wake

CHANNEL = "ratchet_jobs"


class PostgresWakeups(ListenerThread):
    name = "LISTEN/NOTIFY wake-ups"

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self.conninfo = conninfo

    def listen(self, wake: Wake) -> None:
        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.live = True
            while not self.stopping:
                for note in conn.notifies(timeout=1.0):
                    wake(note.payload)
