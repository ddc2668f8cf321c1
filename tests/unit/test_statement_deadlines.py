"""The bounds on a statement's wait for a reply: derived from the heartbeat's settings unless
set, handed to the drivers as TCP parameters, and lifted for schema changes."""

from __future__ import annotations

import pytest

from celery_ratchet.celery.state import engine_options
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.deadline import Bound, bound_for, deadline
from celery_ratchet.store.engine import (
    EngineOptions,
    build_engine,
    libpq_conninfo,
    statement_bound,
    tcp_probes,
)


def test_the_deadlines_follow_the_grace_period_and_the_heartbeat_unless_set() -> None:
    defaults = RatchetSettings()
    assert (defaults.statement_deadline, defaults.liveness_deadline) == (60.0, 25.0)
    short = RatchetSettings(node_heartbeat_interval_seconds=1, node_orphan_grace_seconds=5)
    assert (short.statement_deadline, short.liveness_deadline) == (5.0, 2.0)
    chosen = RatchetSettings.from_sources({}, {"RATCHET_STATEMENT_DEADLINE_SECONDS": "10"})
    assert (chosen.statement_deadline, chosen.liveness_deadline) == (10.0, 10.0)
    off = RatchetSettings(statement_deadline_seconds=0)
    assert (off.statement_deadline, off.liveness_deadline) == (None, None)
    with pytest.raises(ConfigurationError, match="ratchet_statement_deadline_seconds"):
        RatchetSettings(statement_deadline_seconds=-1).validate()


def test_the_store_engine_gets_the_settings_deadlines() -> None:
    options = engine_options(RatchetSettings(statement_deadline_seconds=7))
    assert options.statement_deadline_seconds == 7 and options.liveness_deadline_seconds == 7
    engine = build_engine("postgresql://u@127.0.0.1:1/db", options)
    bound = statement_bound(engine)
    assert bound is not None and bound.seconds == 7
    unbounded = EngineOptions(statement_deadline_seconds=None)
    assert statement_bound(build_engine("postgresql://u@127.0.0.1:1/db", unbounded)) is None
    assert statement_bound(build_engine("sqlite://")) is None


def test_libpq_finds_a_dead_peer_within_about_the_heartbeats_deadline() -> None:
    assert tcp_probes(25) == {
        "keepalives": 1,
        "keepalives_idle": 13,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 25000,
    }
    conninfo = libpq_conninfo("postgresql://u@db/x?keepalives_idle=60")
    assert "keepalives_idle=60" in conninfo and "tcp_user_timeout=25000" in conninfo
    bare = libpq_conninfo("postgresql://u@db/x", EngineOptions(tcp_timeout_seconds=None))
    assert "keepalives" not in bare


def test_a_schema_change_runs_with_no_deadline() -> None:
    engine_bound = Bound(1.0, "ratchet_statement_deadline_seconds", "db")
    with deadline(None):
        assert bound_for(engine_bound) is None
    assert bound_for(engine_bound) is engine_bound
