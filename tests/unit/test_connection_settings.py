"""Connection settings: pool sizes, connect arguments, PgBouncer mode and LISTEN's own URL,
and the errors of an unreachable store that say whether anything may have been written."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.db_errors import (
    unavailable,
)
from celery_ratchet.store.engine import (
    EngineOptions,
    build_engine,
    engine_for,
)


def test_pool_sizes_and_connect_arguments_come_from_settings_and_environment() -> None:
    settings = RatchetSettings.from_sources(
        {"ratchet_pool_size": 3, "ratchet_connect_args": {"sslmode": "disable"}},
        {"RATCHET_MAX_OVERFLOW": "0", "RATCHET_PGBOUNCER": "true"},
    )
    assert (settings.pool_size, settings.max_overflow) == (3, 0)
    assert settings.connect_args == {"sslmode": "disable"}
    assert settings.pgbouncer
    from_env = RatchetSettings.from_sources({}, {"RATCHET_CONNECT_ARGS": '{"keepalives": 1}'})
    assert from_env.connect_args == {"keepalives": 1}


@pytest.mark.parametrize(
    ("conf", "environ"),
    [
        ({"ratchet_pool_size": 0}, {}),
        ({}, {"RATCHET_MAX_OVERFLOW": "-1"}),
        ({}, {"RATCHET_CONNECT_ARGS": "[1, 2]"}),
        ({}, {"RATCHET_CONNECT_ARGS": "{not json"}),
    ],
)
def test_bad_connection_settings_are_refused(
    conf: dict[str, object], environ: dict[str, str]
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"(?i)ratchet_(pool_size|max_overflow|connect_args)"
    ):
        RatchetSettings.from_sources(conf, environ)


def test_behind_pgbouncer_notifications_need_a_direct_listen_url() -> None:
    assert RatchetSettings().wakeups_by_notify
    assert not RatchetSettings(pgbouncer=True).wakeups_by_notify
    assert RatchetSettings(pgbouncer=True, listen_url="postgresql://db/x").wakeups_by_notify
    assert not RatchetSettings(listen_notify=False).wakeups_by_notify


def test_the_engine_has_the_pool_it_was_given() -> None:
    engine = build_engine(
        "postgresql://u@127.0.0.1:1/db", EngineOptions(pool_size=2, max_overflow=3)
    )
    assert engine.pool.size() == 2  # type: ignore[attr-defined]
    assert engine.pool._max_overflow == 3  # type: ignore[attr-defined]
    default = build_engine("postgresql://u@127.0.0.1:1/db")
    assert default.pool.size() == 5  # type: ignore[attr-defined]


def test_one_engine_per_url_and_options() -> None:
    url = "postgresql://u@127.0.0.1:1/db"
    assert engine_for(url) is engine_for(url, EngineOptions())
    assert engine_for(url) is not engine_for(url, EngineOptions(pgbouncer=True))


def _lost() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


def test_an_error_before_anything_was_sent_says_nothing_was_written() -> None:
    error = unavailable("postgresql://u:secret@h/db", _lost(), "no job was enqueued")
    assert not error.outcome_unknown
    assert str(error).endswith("; no job was enqueued")
    assert "secret" not in str(error)


def test_an_error_after_the_statement_was_sent_says_the_outcome_is_unknown() -> None:
    error = unavailable("postgresql://u@h/db", _lost(), "no job was enqueued", sent=True)
    assert error.outcome_unknown
    assert "outcome is unknown" in str(error) and "may have been committed" in str(error)


class _RefusingConnection:
    """A new psycopg connection on which even ``SELECT pg_backend_pid()`` fails."""

    autocommit = False
    rolled_back = False

    def cursor(self) -> _RefusingConnection:
        return self

    def execute(self, sql: str) -> None:
        raise RuntimeError("permission denied")

    def close(self) -> None:
        pass

    def rollback(self) -> None:
        self.rolled_back = True


def test_a_pooler_check_that_fails_keeps_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    from celery_ratchet.store.engine import _serving_backend

    # On the module's own logger: an in-process worker of an earlier test may have left the
    # root logger at ERROR.
    caplog.set_level("WARNING", logger="celery_ratchet.store.engine")
    connection = _RefusingConnection()
    assert _serving_backend(connection, "postgresql://app@db/shop") is None
    assert connection.rolled_back
    assert "pooler" in caplog.text and "RuntimeError" in caplog.text
