"""`schema check` looks at the indexes a database has under the schema's names: an index an
earlier version made whole is a note, an invalid one (a failed concurrent build) a problem."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from celery_ratchet.cli.main import cli
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers


@pytest.fixture(params=["sqlite", "postgresql"])
def private_store(
    request: pytest.FixtureRequest, servers: Servers, tmp_path: Path
) -> Iterator[JobStore]:
    """A store on a database of its own: its indexes are changed here. Named for this
    process, so that two runs at once on one server do not drop each other's."""
    database = f"ratchet_index_shapes_{os.getpid()}"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'indexes.db'}"
    else:
        base = servers.url("postgresql")
        url = base.rsplit("/", 1)[0] + f"/{database}"
        _admin(base, f"DROP DATABASE IF EXISTS {database}")
        _admin(base, f"CREATE DATABASE {database}")
    store = JobStore(url)
    store.ensure_schema()
    try:
        yield store
    finally:
        store.engine.dispose()
        if request.param != "sqlite":
            _admin(servers.url("postgresql"), f"DROP DATABASE IF EXISTS {database}")


def _admin(url: str, sql: str) -> None:
    admin = JobStore(url, create_schema=False)
    with admin.engine.connect() as conn:
        conn.execute(text(sql))
    admin.engine.dispose()


def _check(store: JobStore) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--url", store.url, "schema", "check"])
    return result.exit_code, result.output


def test_the_schema_as_made_has_no_notes(private_store: JobStore) -> None:
    assert private_store.index_shapes() == ([], [])
    assert _check(private_store) == (0, "schema matches\n")


def test_a_whole_index_an_earlier_version_made_is_a_note(private_store: JobStore) -> None:
    with private_store.engine.connect() as conn:
        conn.execute(text("DROP INDEX ix_scheduler_job_finished"))
        conn.execute(
            text("CREATE INDEX ix_scheduler_job_finished ON scheduler_job (status, finished_at)")
        )
    problems, notes = private_store.index_shapes()
    assert problems == []
    assert len(notes) == 1 and "ix_scheduler_job_finished" in notes[0]
    code, output = _check(private_store)
    assert code == 0
    assert "note: index ix_scheduler_job_finished" in output and "upgrade steps" in output


# Only PostgreSQL keeps the index a failed build left.
@pytest.mark.parametrize("private_store", ["postgresql"], indirect=True)
def test_an_invalid_index_fails_the_check(private_store: JobStore) -> None:
    with private_store.engine.connect() as conn:
        conn.execute(text("DROP INDEX ix_scheduler_job_group"))
        for job_id in ("a", "b"):  # two rows a unique index of their queue cannot take
            conn.execute(
                text(
                    "INSERT INTO scheduler_job (job_id, task_name, queue, status, job_type, "
                    "priority, scheduled_time, created_at, attempts, claims, payload, "
                    "content_type, content_encoding, headers, properties) VALUES (:id, 't', "
                    "'q', 'PENDING', 'SINGLE', 4, now(), now(), 0, 0, '', 'application/json', "
                    "'utf-8', '{}', '{}')"
                ),
                {"id": job_id},
            )
        with pytest.raises(Exception, match="could not create unique index"):
            conn.execute(
                text(
                    "CREATE UNIQUE INDEX CONCURRENTLY ix_scheduler_job_group "
                    "ON scheduler_job (queue)"
                )
            )
    problems, _ = private_store.index_shapes()
    assert len(problems) == 1 and "invalid index ix_scheduler_job_group" in problems[0]
    code, output = _check(private_store)
    assert code == 1
    assert "invalid index ix_scheduler_job_group" in output
