"""The store's lookups by chain step, batch and finish time are served by an index.

Three indexes of scheduler_job hold only the rows their queries can ask for (``WHERE
depends_on IS NOT NULL`` and so on) on PostgreSQL and SQLite, so that a plain job's insert
and each of its status changes write fewer index entries. The database uses such an index
only where it can prove from the query that every matching row is in it, bound parameters
included: each statement the store sends with one of those columns in its WHERE is
explained here, as sent, with only those indexes on the table, and must not read the whole
table. PostgreSQL is told to avoid sequential scans, so that a small test table does not make
one the cheaper plan."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg import ClientCursor
from sqlalchemy import event, inspect

from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.metrics_reads import MetricsReads
from celery_ratchet.store.step_rows import cancel_downstream, restore_downstream

#: A WHERE (or a join's ON) comparing one of the partially indexed columns.
_PARTIAL_COLUMNS = re.compile(r"\b(WHERE|AND|ON)\b[^;]*\b(depends_on|group_id|finished_at)\b")


@contextmanager
def _sent(store: JobStore) -> Iterator[list[tuple[str, Any]]]:
    statements: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if "scheduler_job " in statement + " " and _PARTIAL_COLUMNS.search(statement):
            statements.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


#: The indexes that hold only some rows on PostgreSQL and SQLite.
_PARTIAL = {"ix_scheduler_job_depends_on", "ix_scheduler_job_group", "ix_scheduler_job_finished"}


def _full_scans(store: JobStore, statement: str, parameters: Any) -> list[str]:
    """The plan's full reads of scheduler_job with the partial indexes its only indexes: the
    others are dropped in a transaction rolled back after (DDL is transactional on both), so
    that another index cannot stand in for one the database could not prove it may use."""
    with store.engine.connect() as conn:  # autocommit: the transaction is spelled out
        conn.exec_driver_sql("BEGIN")
        try:
            seen = inspect(conn)
            for index in seen.get_indexes("scheduler_job"):
                if index["name"] not in _PARTIAL:
                    conn.exec_driver_sql(f"DROP INDEX {index['name']}")
            if store.family == "postgresql":
                key = seen.get_pk_constraint("scheduler_job")["name"]
                conn.exec_driver_sql(f"ALTER TABLE scheduler_job DROP CONSTRAINT {key}")
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
                plan = _generic_plan(conn, statement, parameters)
                found = [line for line in plan if "Seq Scan on scheduler_job " in line + " "]
            else:
                plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all()
                found = [r[-1] for r in plan if re.match(r"SCAN scheduler_job\b", r[-1])]
        finally:
            conn.exec_driver_sql("ROLLBACK")
    return found


def _generic_plan(conn: Any, statement: str, parameters: Any) -> list[str]:
    """PostgreSQL's plan of the statement for any parameter values, the one a statement
    prepared by the driver gets after a few runs: the values themselves would let the planner
    prove more than it can for a prepared statement."""
    names: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        names.append(match.group(1))
        return f"${len(names)}"

    prepared = re.sub(r"%\((\w+)\)s", numbered, statement)
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.exec_driver_sql(f"PREPARE looked_up AS {prepared}")
    try:
        values = ", ".join(f"%({name})s" for name in names)
        execute = f"EXPLAIN EXECUTE looked_up({values})" if names else "EXPLAIN EXECUTE looked_up"
        # As literals: a bound parameter of EXECUTE would have no type to take.
        spelled = ClientCursor(conn.connection.driver_connection).mogrify(execute, parameters)
        return [line for (line,) in conn.exec_driver_sql(spelled).all()]
    finally:
        conn.exec_driver_sql("DEALLOCATE looked_up")


def test_lookups_by_step_batch_and_finish_time_use_an_index(store: JobStore) -> None:
    if store.family == "mysql":
        pytest.skip("MySQL/MariaDB have no partial index: these indexes hold every row there")
    with _sent(store) as statements:
        seen = Inspection(store)
        seen.job_links("a-job")
        seen.children_by_status("a-batch")
        seen.finished_per_minute(3)
        store.queue_stats()
        MetricsReads(store).read(window_seconds=300, limit=100, bounds=(1.0, 10.0))
        store.archive_finished(30)
        store.expire_results(60)
        batches = BatchStore(store)
        batches.open_groups(["a-group"])
        batches.summaries()
        batches.failed_children("a-group", 10)
        batches.discard_unsent(["a-batch"])
        with store.engine.begin() as conn:
            cancel_downstream(conn, ["a-step", "another-step"], "it failed")
            restore_downstream(conn, ["a-step"])
    columns = {m.group(2) for s, _ in statements for m in [_PARTIAL_COLUMNS.search(s)] if m}
    assert columns == {"depends_on", "group_id", "finished_at"}, columns
    for statement, parameters in statements:
        assert _full_scans(store, statement, parameters) == [], statement
