"""A statement compiled for its driver (store/raw.py) binds what the caller gives and what
the statement carries itself, under the names its SQL uses."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import bindparam, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from celery_ratchet.store.raw import raw_statement
from celery_ratchet.store.schema import scheduler_job

_DIALECTS = {"postgresql": postgresql.psycopg.dialect(), "sqlite": sqlite.pysqlite.dialect()}


def _released() -> object:
    return (
        update(scheduler_job)
        .where(scheduler_job.c.job_id == bindparam("p_job_id"), scheduler_job.c.status == "WAITING")
        .values(status="RUNNING", claims=1, started_at=None, expires_at=bindparam("p_expires"))
    )


@pytest.mark.parametrize("name", sorted(_DIALECTS))
def test_values_the_statement_carries_are_bound_beside_the_callers(name: str) -> None:
    dialect: Dialect = _DIALECTS[name]
    raw = raw_statement(_released(), dialect)
    assert set(raw.names) == {"p_job_id", "p_expires"}
    due = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
    bound = raw.parameters({"p_job_id": "j1", "p_expires": due})
    if raw.order is None:  # named: every name in the SQL has its value
        assert all(f"%({key})s" in raw.sql for key in bound)
        values = bound
    else:  # positional: one value per placeholder, in order
        assert raw.sql.count("?") == len(bound) == len(raw.order)
        values = dict(zip(raw.order, bound, strict=True))
    assert "j1" in values.values() and "RUNNING" in values.values()
    assert "WAITING" in values.values() and 1 in values.values()
    # A typed parameter is processed as SQLAlchemy would (SQLite stores text).
    expires = next(v for k, v in values.items() if k == "p_expires")
    assert (expires == due) if name == "postgresql" else isinstance(expires, str)


@pytest.mark.parametrize("name", sorted(_DIALECTS))
def test_a_value_the_statement_carries_is_never_replaced_by_a_callers(name: str) -> None:
    raw = raw_statement(_released(), _DIALECTS[name])
    bound = raw.parameters({"p_job_id": "j1", "p_expires": None, "status": "CALLER"})
    values = bound.values() if raw.order is None else bound
    assert "CALLER" not in values and "RUNNING" in values


@pytest.mark.parametrize("name", sorted(_DIALECTS))
def test_an_in_list_is_refused_when_compiled_not_when_run(name: str) -> None:
    listed = update(scheduler_job).where(scheduler_job.c.status.in_(["A", "B"])).values(claims=0)
    with pytest.raises(ValueError, match="IN list"):
        raw_statement(listed, _DIALECTS[name])
