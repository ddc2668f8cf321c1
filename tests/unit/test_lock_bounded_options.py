"""The outcome writer's lock-bounded connections: a pool of their own, and none where a
session setting cannot be kept (see store/engine.py)."""

from __future__ import annotations

from celery_ratchet.store.engine import EngineOptions, lock_bounded_options


def test_no_bound_where_a_session_setting_cannot_be_kept() -> None:
    assert lock_bounded_options("sqlite", EngineOptions(), 0.2) is None
    assert lock_bounded_options("postgresql", EngineOptions(pgbouncer=True), 0.2) is None


def test_a_bounded_pool_is_small_keeps_the_application_s_connect_arguments() -> None:
    mine = EngineOptions(pool_size=20, connect_args={"options": "-c search_path=app"})
    for kind in ("postgresql", "mysql"):
        bounded = lock_bounded_options(kind, mine, 0.2)
        assert bounded is not None
        assert (bounded.pool_size, bounded.max_overflow, bounded.lock_wait_seconds) == (1, 1, 0.2)
        assert bounded.connect_args == mine.connect_args
        assert bounded.key() != mine.key()  # an engine of its own
