"""The shipped ddl/*.sql files are exactly what the schema code generates."""

from __future__ import annotations

import pytest

from celery_ratchet.store.ddl import DIALECTS, ddl_file, ddl_script


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_shipped_ddl_equals_generated(dialect: str) -> None:
    assert ddl_file(dialect).read_text() == ddl_script(dialect), (
        f"ddl/{dialect}.sql is stale: run `python -m celery_ratchet.store.ddl`"
    )


def test_every_table_of_the_seeds_is_there() -> None:
    script = ddl_script("postgresql")
    for table in (
        "scheduler_job",
        "scheduler_job_archive",
        "scheduler_node",
        "scheduler_resource_permit",
    ):
        assert f"CREATE TABLE {table} (" in script
