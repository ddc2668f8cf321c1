"""A store URL that is misspelt, missing or mistyped is said, not followed into a new store.

A client whose configuration names no store would send to ``./ratchet.db``, where the fleet's
workers never look: a misspelt setting is refused, the default store is named once, and a
SQLite path into a directory that does not exist is refused instead of made.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from celery_ratchet import Celery
from celery_ratchet.celery import state
from celery_ratchet.errors import ConfigurationError


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RATCHET_URL", raising=False)
    monkeypatch.setattr(state, "_default_store_told", state.threading.Event())
    return tmp_path


def _app(**conf: object) -> Celery:
    app = Celery("typo", set_as_current=False)
    app.conf.update(conf)

    @app.task(name="typo.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    return app


def test_a_misspelt_setting_fails_the_first_send_and_names_the_setting(workdir: Path) -> None:
    app = _app(ratchet_ulr="postgresql://app:s3cret@127.0.0.1/shop")
    with pytest.raises(ConfigurationError) as raised:
        app.tasks["typo.add"].delay(1, 2)
    message = str(raised.value)
    assert "unknown setting ratchet_ulr: did you mean ratchet_url?" in message
    assert "s3cret" not in message
    assert list(workdir.iterdir()) == []


def test_the_default_store_is_named_once_in_a_process(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_ratchet")
    first, second = _app(), _app()
    first.tasks["typo.add"].delay(1, 2)
    second.tasks["typo.add"].delay(3, 4)
    told = [r for r in caplog.records if "the default" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert told[0].levelno == logging.WARNING
    assert "sqlite:///ratchet.db" in told[0].getMessage()
    assert "ratchet_url" in told[0].getMessage()
    assert (workdir / "ratchet.db").exists()


def test_a_store_url_that_is_set_is_not_called_the_default(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_ratchet")
    _app(ratchet_url="sqlite:///ratchet.db").tasks["typo.add"].delay(1, 2)
    assert not [r for r in caplog.records if "the default" in r.getMessage()]


def test_a_sqlite_path_into_a_missing_directory_is_refused_not_made(workdir: Path) -> None:
    missing = workdir / "no" / "such"
    app = _app(ratchet_url=f"sqlite:///{missing / 'ratchet.db'}")
    with pytest.raises(ConfigurationError) as raised:
        app.tasks["typo.add"].delay(1, 2)
    assert f"the directory {missing} does not exist; create it" in str(raised.value)
    assert not (workdir / "no").exists()


def test_a_relative_sqlite_path_stays_in_the_directory_of_its_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite resolves a relative path at each connect: an engine kept for the URL opened its
    # next connection in whatever directory the process was in by then, making a stray store.
    from sqlalchemy import text

    from celery_ratchet.store.engine import engine_for

    first, then = tmp_path / "first", tmp_path / "then"
    first.mkdir()
    then.mkdir()
    monkeypatch.chdir(first)
    engine = engine_for("sqlite:///ratchet.db")
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE marker (x INTEGER)"))
    monkeypatch.chdir(then)
    engine.dispose()  # the next connection is a new one
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM marker")).scalar() == 0
    assert engine_for("sqlite:///ratchet.db") is not engine
    engine_for("sqlite:///ratchet.db").dispose()
    engine.dispose()
    assert list(then.iterdir()) == []
