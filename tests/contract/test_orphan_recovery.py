"""Orphan recovery on the three databases: a node is dead only if its heartbeat stood still
as the judge saw it; rows with no owner or no claim time are recovered too; a job whose nodes
keep dying under it goes to the dead-letter queue instead of running forever."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from sqlalchemy import text

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from tests.helpers import new_job


def _silence(store: JobStore | MemoryStore, *nodes: str, minutes: float = 10) -> None:
    """Heartbeats of ``nodes`` as if written ``minutes`` ago (as after a database outage)."""
    moment = datetime.now(timezone.utc) - timedelta(minutes=minutes)
    if isinstance(store, MemoryStore):
        store.forge(lambda rows: [setattr(rows.nodes[n], "heartbeat_ts", moment) for n in nodes])
        return
    with store.engine.begin() as conn:
        for node in nodes:
            conn.execute(
                text("UPDATE scheduler_node SET heartbeat_ts = :t WHERE node_id = :n"),
                {"t": moment, "n": node},
            )


def _forge(store: JobStore | MemoryStore, job_id: str, **values: object) -> None:
    """The job's row with ``values`` in its columns, as no operation writes them."""
    if isinstance(store, MemoryStore):
        store.forge(lambda rows: [setattr(rows.jobs[job_id], k, v) for k, v in values.items()])
        return
    assignments = ", ".join(f"{column} = :{column}" for column in values)
    with store.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE scheduler_job SET {assignments} WHERE job_id = :j"),
            {"j": job_id, **values},
        )


def _status(store: JobStore, job_id: str) -> JobStatus:
    record = store.result(job_id)
    assert record is not None
    return record.status


def test_a_node_whose_heartbeat_moved_since_it_was_observed_is_not_declared_dead(
    store: JobStore,
) -> None:
    for node in ("stopped", "beating"):
        store.register_node(node, "h", 1, ["celery"], 1)
    store.enqueue_many([new_job("of-stopped"), new_job("of-beating")])
    store.claim("stopped", ["celery"], 1)
    store.claim("beating", ["celery"], 1)
    # After an outage every heartbeat is old by the database clock ...
    _silence(store, "stopped", "beating")
    observed = store.node_heartbeats()
    # ... but one node beats again before the judge acts.
    assert store.heartbeat("beating")

    recovered = store.recover_orphans(1.0, observed=observed)

    assert (recovered.dead_nodes, recovered.requeued) == (["stopped"], ["of-stopped"])
    assert _status(store, "of-beating") is JobStatus.RUNNING
    assert store.heartbeat("beating")
    assert not store.heartbeat("stopped")


def test_with_nothing_observed_no_node_is_declared_dead_however_old_its_heartbeat(
    store: JobStore,
) -> None:
    store.register_node("n1", "h", 1, ["celery"], 1)
    store.enqueue(new_job("held"))
    store.claim("n1", ["celery"], 1)
    _silence(store, "n1")

    recovered = store.recover_orphans(1.0, observed={})

    assert recovered.jobs == [] and recovered.dead_nodes == []
    assert _status(store, "held") is JobStatus.RUNNING
    assert store.heartbeat("n1")


def test_running_rows_with_no_owner_or_no_claim_time_are_recovered(store: JobStore) -> None:
    store.register_node("live", "h", 1, ["celery"], 1)
    store.register_node("gone", "h", 2, ["celery"], 1)
    ids = ["no-owner", "no-owner-no-time", "unregistered-no-time", "dead-no-time", "live-no-time"]
    store.enqueue_many([new_job(i) for i in ids])
    store.claim("gone", ["celery"], 4)
    half_a_minute_ago = datetime.now(timezone.utc) - timedelta(seconds=30)
    _forge(store, "no-owner", picked_by=None, claimed_at=half_a_minute_ago)
    _forge(store, "no-owner-no-time", picked_by=None, claimed_at=None)
    _forge(store, "unregistered-no-time", picked_by="never-registered", claimed_at=None)
    _forge(store, "dead-no-time", claimed_at=None)
    [live_job] = store.claim("live", ["celery"], 1)
    assert live_job.job_id == "live-no-time"
    _forge(store, "live-no-time", claimed_at=None)
    _silence(store, "gone", minutes=0.1)
    # "no-owner" has a claim time: an owner-less row waits out the grace period first.
    assert store.recover_orphans(60.0, observed={}).requeued == [
        "no-owner-no-time",
        "unregistered-no-time",
    ]
    observed = {"gone": store.node_heartbeats()["gone"]}

    recovered = store.recover_orphans(1.0, observed=observed)

    assert recovered.requeued == ["dead-no-time", "no-owner"]
    assert _status(store, "live-no-time") is JobStatus.RUNNING
    # The live node's own check finds its claim with no time, and hands it back.
    assert store.running_claims("live", older_than_seconds=60) == [("live-no-time", live_job.token)]


def test_a_job_whose_nodes_keep_dying_goes_to_the_dead_letter_queue(store: JobStore) -> None:
    store.enqueue(new_job("poison"))
    for death in range(1, 4):
        node = f"node-{death}"
        store.register_node(node, "h", death, ["celery"], 1)
        [job] = store.claim(node, ["celery"], 1)
        assert job.claims == death
        _silence(store, node)
        recovered = store.recover_orphans(1.0, observed=store.node_heartbeats(), max_recoveries=2)
        assert recovered.dead_nodes == [node]
        if death <= 2:
            assert (recovered.requeued, recovered.dead_lettered) == (["poison"], [])
            assert _status(store, "poison") is JobStatus.PENDING
    assert (recovered.requeued, recovered.dead_lettered) == ([], ["poison"])
    record = store.result("poison")
    assert record is not None and record.status is JobStatus.FAILED
    error = json.loads(record.last_error or "")
    assert (error["exc_type"], error["exc_module"]) == (
        "RecoveryLimitExceeded",
        "celery_ratchet.errors",
    )
    [message] = error["exc_message"]
    assert "after 3 claims" in message and "ratchet_max_recoveries = 2" in message
    assert "ratchet dlq retry" in message
    assert store.claim("node-4", ["celery"], 1) == []


def test_a_recurring_master_is_never_dead_lettered_however_often_it_was_claimed(
    store: JobStore,
) -> None:
    store.register_node("dead", "h", 1, ["celery"], 1)
    store.enqueue(new_job("master"))
    store.claim("dead", ["celery"], 1)
    _forge(store, "master", job_type="RECURRING", claims=500)
    _silence(store, "dead")

    recovered = store.recover_orphans(1.0, observed=store.node_heartbeats(), max_recoveries=2)

    assert (recovered.requeued, recovered.dead_lettered) == (["master"], [])
