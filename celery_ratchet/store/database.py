"""One database: its engine, whether it answers, the retry and outage policy, wake-up
announcements and the schema checks. Every part of the store runs its statements here."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError

from celery_ratchet.errors import (
    SchemaMissing,
    SchemaOutdated,
    StoreBusy,
    StorePermissionDenied,
    StoreUnavailable,
)
from celery_ratchet.store import deadline
from celery_ratchet.store.db_errors import (
    cancelled,
    is_missing_column,
    is_missing_table,
    is_not_a_database,
    is_permission_denied,
    is_prepared_statement_conflict,
    is_retryable_conflict,
    is_statement_cancelled,
    is_unavailable,
    not_a_database,
    permission_denied,
    prepared_statement_conflict,
    refused,
    refused_by_server,
    unavailable,
)
from celery_ratchet.store.ddl import bring_up_to_date, index_shapes, schema_differences
from celery_ratchet.store.dialect import Dialect, dialect_for
from celery_ratchet.store.engine import (
    EngineOptions,
    engine_for,
    family,
    liveness_bound,
    lock_bounded_options,
)
from celery_ratchet.store.job_rows import NOTIFY_CHANNEL, job
from celery_ratchet.store.packets import dropped_for_size, too_large
from celery_ratchet.store.redact import mask_url

logger = logging.getLogger(__name__)


class Reachability:
    """Logs the job store going away once, and its return once, per process: not one line
    per failed statement. Processes whose outages another process reports (a worker's pool
    processes, reported by the worker) log them at DEBUG only (:func:`quiet_outages`)."""

    #: Level of the two lines; DEBUG where another process of the same worker logs them.
    level = logging.WARNING

    def __init__(self, display_url: str) -> None:
        self.display_url = display_url
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        logger.log(self.level, "ratchet: the job store is unreachable: %s", exc)

    def succeeded(self, started: float) -> None:
        """A statement begun at ``started`` (monotonic) answered. One begun before the
        outage was seen says nothing of its end: it may have answered just as the server
        went away, while another thread's failed."""
        if self._down_since is None:  # read without the lock: the common case stays cheap
            return
        with self._lock:
            since = self._down_since
            if since is None or started < since:
                return
            self._down_since = None
        if since is not None:
            logger.log(
                self.level,
                "ratchet: the job store at %s is reachable again after %.1fs",
                self.display_url,
                time.monotonic() - since,
            )


def quiet_outages() -> None:
    """In this process, log the job store's outages at DEBUG: another process (the worker's
    main process) reports them."""
    Reachability.level = logging.DEBUG


@contextlib.contextmanager
def outages_said_by_caller() -> Iterator[None]:
    """Within, the job store's outages are logged at DEBUG: the caller (a CLI command)
    says its error itself, as its one line."""
    level, Reachability.level = Reachability.level, logging.DEBUG
    try:
        yield
    finally:
        Reachability.level = level


T = TypeVar("T")
CONFLICT_RETRIES = 5


class Database:
    """One database the store keeps its rows in: the engine, whether it answers (and the
    log lines when it stops or starts answering), the retry and outage policy of every
    statement, LISTEN/NOTIFY announcements and the schema checks. Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        create_schema: bool = True,
        engine: Engine | None = None,
        notify: bool = False,
        engine_options: EngineOptions | None = None,
    ) -> None:
        self.url = url
        #: How the engine's connections are made; None: an engine handed in, made elsewhere.
        self._engine_options = (engine_options or EngineOptions()) if engine is None else None
        self._lock_bounded_engines: dict[float, Engine | None] = {}
        self.display_url = mask_url(url)
        #: Whether the database answers, as this process last found it.
        self.reachability = Reachability(self.display_url)
        self.engine = engine or engine_for(url, engine_options)
        self.family = family(self.engine.dialect.name)
        #: What this database does differently (store/dialect.py).
        self.dialect: Dialect = dialect_for(self.engine.dialect)
        #: The deadline of a heartbeat's and a registration's statements (store/deadline.py).
        self._liveness_bound = liveness_bound(
            self.engine, self._engine_options or engine_options or EngineOptions()
        )
        self._create_schema = create_schema
        self._schema_ready = False
        #: PostgreSQL: inserts notify listening workers (LISTEN/NOTIFY wake-ups).
        self.notify = notify and self.dialect.notifies
        #: Called when notifying stops (:meth:`stop_notifying`): parts that prepared
        #: notifying statements prepare silent ones.
        self._on_silent: list[Callable[[], None]] = []

    def when_silent(self, prepare: Callable[[], None]) -> None:
        """Call ``prepare`` once the database stops notifying (:meth:`stop_notifying`)."""
        self._on_silent.append(prepare)

    def stop_notifying(self) -> None:
        """No more ``pg_notify`` on inserts: nothing receives them (see ``send_probe``)."""
        self.notify = False
        for prepare in self._on_silent:
            prepare()

    def send_probe(self, payload: str) -> None:
        """NOTIFY the wake-up channel through the store's own connections, the way inserts
        do: a listener that never receives it listens where enqueues do not notify."""
        statement = select(func.pg_notify(NOTIFY_CHANNEL, bindparam("payload")))
        self.attempt(
            lambda conn: conn.execute(statement, {"payload": payload}),
            "the wake-up probe was not sent",
        )

    def run(
        self,
        work: Callable[[Connection], T],
        what: str,
        *,
        lock_wait: float | None = None,
        conflict_retries: int = CONFLICT_RETRIES,
        liveness: bool = False,
    ) -> T:
        """``work`` on a pooled connection (see :meth:`attempt`); ``lock_wait``: on one
        that waits at most that many seconds on a lock another transaction holds, where the
        database lets a connection be made so (:meth:`lock_bounded_engine`); ``liveness``:
        a heartbeat or a registration, whose statements get the shorter deadline that keeps
        the node in time for the others' judgement (store/deadline.py)."""
        self.ensure_schema()
        engine = self.lock_bounded_engine(lock_wait) if lock_wait is not None else None
        connect = engine.connect if engine is not None else None
        if liveness:
            with deadline.deadline(self._liveness_bound):
                return self.attempt(work, what, connect, conflict_retries)
        return self.attempt(work, what, connect, conflict_retries)

    def lock_bounded_engine(self, seconds: float) -> Engine | None:
        try:
            return self._lock_bounded_engines[seconds]
        except KeyError:
            pass
        options = None
        if self._engine_options is not None:
            options = lock_bounded_options(self.family, self._engine_options, seconds)
        engine = None if options is None else engine_for(self.url, options)
        self._lock_bounded_engines[seconds] = engine
        return engine

    def attempt(
        self,
        work: Callable[[Any], T],
        what: str,
        connect: Callable[[], Any] | None = None,
        conflict_retries: int = CONFLICT_RETRIES,
    ) -> T:
        """Run ``work`` on a pooled connection: once more after a dropped connection, a few
        more times (``conflict_retries``) after a deadlock or a lock wait that ran out;
        :class:`StoreUnavailable` when the database is gone. ``connect``: where the
        connection comes from (default: a SQLAlchemy Connection)."""
        started = time.monotonic()
        try:
            done = self._attempt_once(work, what, connect or self.engine.connect, conflict_retries)
        except StorePermissionDenied:
            raise  # reached: no outage to log
        except StoreUnavailable as exc:
            self.reachability.failed(exc)
            raise
        self.reachability.succeeded(started)
        return done

    def _attempt_once(
        self,
        work: Callable[[Any], T],
        what: str,
        connect: Callable[[], Any],
        conflict_retries: int = CONFLICT_RETRIES,
    ) -> T:
        reconnected = False
        conflicts = 0
        #: A statement went out before the connection was lost: it may have been committed.
        maybe_sent = False
        while True:
            connected = False
            try:
                with connect() as conn:
                    connected = True
                    return work(conn)
            except DBAPIError as exc:
                if is_prepared_statement_conflict(exc):
                    raise prepared_statement_conflict(exc, what) from exc
                if is_statement_cancelled(exc):
                    raise cancelled(exc, what) from exc
                if is_permission_denied(exc):
                    raise permission_denied(self.url, exc, what) from exc
                if self.dialect.limits_statement_size and dropped_for_size(self.engine, exc):
                    raise too_large(self.engine, exc, what) from exc
                if is_retryable_conflict(exc):
                    if conflicts >= conflict_retries:
                        raise StoreBusy(
                            f"the job store kept refusing for lock conflicts ({exc.orig}), "
                            f"{conflict_retries + 1} tries: another client holds locks on "
                            "the ratchet tables (a long transaction, a schema change); find "
                            f"it, or raise the server's lock wait limit; {what}"
                        ) from exc
                    conflicts += 1
                    time.sleep(0.005 * conflicts)
                    continue
                if is_missing_column(exc):
                    raise SchemaOutdated(
                        f"the job store at {self.display_url} lacks a column this version "
                        f"uses ({_first_line(exc.orig)}): its tables were made by an earlier "
                        "version; bring them up to date with `ratchet --url URL schema "
                        "apply`, or start a process with ratchet_create_schema on; "
                        f"{what}"
                    ) from exc
                if is_unavailable(exc):
                    # A server that refused the statement (read-only, no space left) wrote
                    # nothing of it.
                    maybe_sent = maybe_sent or (connected and not refused_by_server(exc))
                    if exc.connection_invalidated and not reconnected:
                        reconnected = True
                        continue
                    raise unavailable(self.url, exc, what, sent=maybe_sent) from exc
                if isinstance(exc, DataError):
                    raise refused(exc, what) from exc
                if is_not_a_database(exc):
                    raise not_a_database(self.display_url, exc) from exc
                if is_missing_table(exc):
                    raise self._schema_missing(what) from exc
                raise
            except Exception as exc:
                if is_unavailable(exc):
                    maybe_sent = maybe_sent or connected
                    raise unavailable(self.url, exc, what, sent=maybe_sent) from exc
                raise

    def _schema_missing(self, what: str) -> SchemaMissing:
        """Advice that fits this process: with ``ratchet_create_schema`` off, starting a
        worker creates nothing. A read's ``what`` ("nodes were not read") says nothing a
        reader needs: with no tables, nothing was read or written."""
        if self._create_schema:
            create = (
                "create them with `ratchet --url URL schema apply`, or start a worker (with "
                "ratchet_create_schema on, the default, it creates them)"
            )
        else:
            create = (
                "create them with `ratchet --url URL schema apply` (ratchet_create_schema is "
                "off for this process: it creates none), or start a worker with "
                "ratchet_create_schema on"
            )
        outcome = "" if what.endswith("not read") else f"; {what}"
        return SchemaMissing(
            f"the job store at {self.display_url} has no ratchet tables (or not all of them): "
            f"{create}{outcome}"
        )

    @property
    def schema_ready(self) -> bool:
        """Whether this process found (or made) the schema in place."""
        return self._schema_ready

    def schema_found(self) -> None:
        """The schema was found in place otherwise (a caller's transaction looked)."""
        self._schema_ready = True

    def ensure_schema(self) -> None:
        if self._schema_ready or not self._create_schema:
            return
        # At start-up, active jobs of an earlier version sharing a business key do not keep
        # this process from running: the unique index waits for a later start (a warning).
        with deadline.deadline(None):  # a schema change may run long: no deadline
            created = self.attempt(
                lambda conn: bring_up_to_date(conn, wait_for_unique_keys=True),
                "the schema was not created",
            )
        self._schema_ready = True
        if created:
            logger.info("ratchet: created or brought up to date: %s", ", ".join(created))

    def create_missing_tables(self) -> list[str]:
        with deadline.deadline(None):
            return self.attempt(self._create_tables, "the schema was not created")

    def schema_differences(self) -> list[str]:
        """What the live database lacks of the schema: tables, columns, indexes."""
        with deadline.deadline(None):
            return self.attempt(schema_differences, "the schema was not checked")

    def index_shapes(self) -> tuple[list[str], list[str]]:
        """Indexes of the schema's names not as this version makes them: (problems, notes)."""
        with deadline.deadline(None):
            return self.attempt(index_shapes, "the indexes were not checked")

    def _create_tables(self, conn: Connection) -> list[str]:
        # Serialized by the database's schema lock: processes starting together on an empty
        # database create one schema, and none of them sees another's half-made tables.
        return bring_up_to_date(conn)

    def announce(self, word: str) -> None:
        """PostgreSQL with LISTEN/NOTIFY on: tell listening workers ``word`` now."""
        if self.notify:
            self.run(lambda conn: self.announce_in(conn, word), "no wake-up was sent")

    def announce_in(self, conn: Connection, word: str) -> None:
        """PostgreSQL with LISTEN/NOTIFY on: tell listening workers ``word`` (a queue name,
        or a word such as ``REVOCATIONS_WAKEUP``), delivered when the transaction commits."""
        if self.notify:
            conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, word)))

    def announce_queues_of(self, conn: Connection, job_ids: Sequence[str]) -> None:
        """Tell listening workers the queues of these jobs (each queue once: PostgreSQL
        delivers one notification per distinct payload of a transaction)."""
        if self.notify and job_ids:
            conn.execute(
                select(func.pg_notify(NOTIFY_CHANNEL, job.c.queue)).where(
                    job.c.job_id.in_(list(job_ids))
                )
            )


def _first_line(orig: Any) -> str:
    """The database's own message, its first line: for a missing column, which one (the
    statement and its parameters are on the lines after it, or not in it at all)."""
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    text_ = args[1] if len(args) > 1 and isinstance(args[1], str) else str(orig)
    return text_.strip().splitlines()[0] if text_.strip() else type(orig).__name__
