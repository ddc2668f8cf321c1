"""Which URLs reach the job store's database, for writing jobs in the caller's transaction."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from celery_ratchet.store.engine import same_database


@pytest.mark.parametrize(
    ("store", "other"),
    [
        ("postgresql://app@127.0.0.1:5432/shop", "postgresql+psycopg://other@localhost/shop"),
        ("postgresql://db.internal/shop", "postgresql+psycopg2://db.internal:5432/shop"),
        ("mysql+pymysql://127.0.0.1/shop", "mariadb+mysqldb://localhost:3306/shop"),
        ("sqlite:///data/../data/ratchet.db", "sqlite+pysqlite:///data/ratchet.db"),
    ],
)
def test_the_same_server_and_database_under_other_spellings(store: str, other: str) -> None:
    assert same_database(make_url(store), make_url(other))


@pytest.mark.parametrize(
    ("store", "other"),
    [
        ("postgresql://127.0.0.1/shop", "postgresql://127.0.0.1/billing"),
        ("postgresql://127.0.0.1/shop", "postgresql://127.0.0.1:5433/shop"),
        ("postgresql://db-a/shop", "postgresql://db-b/shop"),
        ("postgresql://127.0.0.1/shop", "mysql://127.0.0.1/shop"),
        ("sqlite:///ratchet.db", "sqlite:///other.db"),
    ],
)
def test_another_database_server_or_kind(store: str, other: str) -> None:
    assert not same_database(make_url(store), make_url(other))
