"""Wake-ups over PostgreSQL LISTEN/NOTIFY: no Redis needed.

After each LISTEN, a probe notification is sent the way enqueues notify (through the job
store's own connections). When it never arrives, the LISTEN connection cannot hear enqueues:
typically the URL goes through PgBouncer in transaction mode, where LISTEN lands on a server
connection that is handed to other clients. The listener then warns, stops, and this
process's inserts stop notifying: polling alone is correct, only slower.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from celery_ratchet.events import ListenerThread, Wake

logger = logging.getLogger(__name__)

CHANNEL = "ratchet_jobs"
#: Payloads of probe notifications (never a queue name): every listener ignores them.
PROBE_PREFIX = "ratchet-probe:"
PROBE_TIMEOUT_SECONDS = 10.0
#: The LISTEN connection's name in pg_stat_activity, unless the URL names it.
APPLICATION_NAME = "ratchet wake-ups"


class PostgresWakeups(ListenerThread):
    name = "LISTEN/NOTIFY wake-ups"

    def __init__(
        self,
        conninfo: str,
        *,
        probe: Callable[[str], None] | None = None,
        on_silent: Callable[[], None] | None = None,
        probe_timeout: float = PROBE_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__()
        self.conninfo = conninfo
        self.probe = probe
        self.on_silent = on_silent
        self.probe_timeout = probe_timeout
        #: Set once a probe arrived; False after one was lost (the listener stopped).
        self.heard_probe: bool | None = None
        #: The payload of the probe sent and not heard yet.
        self._probe_token: str | None = None

    def listen(self, wake: Wake) -> None:
        # The conninfo carries the job store's connect_timeout (per host of a list).
        conninfo = self.conninfo
        if "application_name" not in conninfo_to_dict(conninfo):
            conninfo = make_conninfo(conninfo, application_name=APPLICATION_NAME)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # Read before the LISTEN: nothing can be notified to the connection meanwhile.
            keep_alive = _keep_alive_interval(conn)
            conn.execute(f"LISTEN {CHANNEL}")
            self.subscribed(wake)
            self._probe_token = None
            deadline = 0.0
            if self.probe is not None:
                self._probe_token = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
                self.probe(self._probe_token)
                deadline = time.monotonic() + self.probe_timeout
            next_statement = time.monotonic() + (keep_alive or 0.0)
            while not self.stopping:
                if keep_alive is not None and time.monotonic() >= next_statement:
                    self._heard(_run_keeping_notifies(conn, KEEP_ALIVE_STATEMENT), wake)
                    next_statement = time.monotonic() + keep_alive
                self._heard(conn.notifies(timeout=min(1.0, keep_alive or 1.0)), wake)
                if self._probe_token is not None and time.monotonic() > deadline:
                    self._silent(conn)
                    return

    def _heard(self, notes: Iterable[psycopg.Notify], wake: Wake) -> None:
        for note in notes:
            if note.payload.startswith(PROBE_PREFIX):
                if note.payload == self._probe_token:
                    self._probe_token = None
                    self.heard_probe = True
                continue
            wake(note.payload)

    def _silent(self, conn: psycopg.Connection) -> None:
        logger.warning(
            "ratchet: LISTEN/NOTIFY wake-ups hear nothing: a probe notified through the job "
            "store did not reach the LISTEN connection within %.0f s. Behind PgBouncer in "
            "transaction mode LISTEN cannot work: set ratchet_pgbouncer = True and "
            "ratchet_listen_url to a direct PostgreSQL URL. Meanwhile this worker polls, and "
            "its inserts no longer notify",
            self.probe_timeout,
        )
        self.heard_probe = False
        # The LISTEN may sit on a pooled server connection, collecting notifications for
        # whichever client gets it next.
        with contextlib.suppress(psycopg.Error):
            conn.execute("UNLISTEN *")
        if self.on_silent is not None:
            self.on_silent()
        self._stop.set()


#: What the LISTEN connection runs now and then on a server that ends idle sessions.
KEEP_ALIVE_STATEMENT = "SELECT 1"


def _run_keeping_notifies(conn: psycopg.Connection, statement: str) -> list[psycopg.Notify]:
    """Run ``statement`` on the LISTEN connection; the notifications that arrived while it
    ran. psycopg before 3.3 hands those to notify handlers only (``notifies()`` never
    yields them), so one is registered meanwhile."""
    caught: list[psycopg.Notify] = []
    handler = caught.append
    conn.add_notify_handler(handler)
    try:
        conn.execute(statement)
    finally:
        conn.remove_notify_handler(handler)
    return caught


def _keep_alive_interval(conn: psycopg.Connection) -> float | None:
    """How often the LISTEN connection, idle between notifications, runs a statement so
    that the server's ``idle_session_timeout`` (PostgreSQL 14 and later) does not end it:
    a third of the timeout; None when there is none."""
    row = conn.execute(
        "SELECT setting FROM pg_settings WHERE name = 'idle_session_timeout'"
    ).fetchone()
    milliseconds = int(row[0]) if row is not None else 0
    return milliseconds / 3000 if milliseconds > 0 else None
