"""Jobs of a task the claiming node does not know, handed to a live node that knows it (a
rolling or canary deploy), on every database and in memory: nodes say which tasks they have
when they register; a handed job is PENDING for that node alone to claim; the mark lapses
when that node is removed or declared dead."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from tests.helpers import new_job

Store = JobStore | MemoryStore


def _silence(store: Store, node: str) -> None:
    """The node's heartbeat as if written ten minutes ago."""
    moment = datetime.now(timezone.utc) - timedelta(minutes=10)
    if isinstance(store, MemoryStore):
        store.forge(lambda rows: setattr(rows.nodes[node], "heartbeat_ts", moment))
        return
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduler_node SET heartbeat_ts = :t WHERE node_id = :n"),
            {"t": moment, "n": node},
        )


def _status(store: Store, job_id: str) -> JobStatus:
    record = store.result(job_id)
    assert record is not None
    return record.status


def _register(store: Store) -> None:
    """A node of the release before, one of the next serving two queues, one of the next
    serving another queue, and one of an earlier version that says nothing."""
    store.register_node("old", "h", 1, ["celery"], 1, task_names=["acc.add"])
    store.register_node("new", "h", 2, ["celery", "b"], 1, task_names=["acc.add", "acc.next"])
    store.register_node("other", "h", 3, ["b"], 1, task_names=["acc.next"])
    store.register_node("legacy", "h", 4, ["celery"], 1)


def test_the_live_nodes_that_said_they_have_a_task_and_serve_its_queue_are_found(
    store: Store,
) -> None:
    _register(store)
    assert store.nodes_knowing("acc.next", "celery", 60, excluding="old") == ["new"]
    assert store.nodes_knowing("acc.next", "b", 60, excluding="old") == ["new", "other"]
    assert store.nodes_knowing("acc.next", "b", 60, excluding="new") == ["other"]
    assert store.nodes_knowing("acc.add", "celery", 60) == ["new", "old"]  # legacy said nothing
    assert store.nodes_knowing("acc.gone", "celery", 60) == []
    assert store.nodes_knowing("acc.next", "nobody-serves-it", 60) == []
    _silence(store, "new")
    assert store.nodes_knowing("acc.next", "celery", 60, excluding="old") == []
    assert store.nodes_knowing("acc.next", "b", 60) == ["other"]


def test_a_node_registered_again_says_its_tasks_again(store: Store) -> None:
    store.register_node("n", "h", 1, ["celery"], 1, task_names=["acc.add"])
    store.register_node("n", "h", 1, ["celery"], 1, task_names=["acc.next"])
    assert store.nodes_knowing("acc.next", "celery", 60) == ["n"]
    assert store.nodes_knowing("acc.add", "celery", 60) == []


def test_a_job_handed_to_a_node_is_claimed_by_that_node_alone(store: Store) -> None:
    _register(store)
    store.enqueue(new_job("j", task="acc.next"))
    [claimed] = store.claim("old", ["celery"], 10)

    assert store.hand_to([("j", claimed.token, "new")]) == 1
    assert _status(store, "j") is JobStatus.PENDING
    # A lost claim hands nothing over (the compare-and-swap of every write under a claim).
    assert store.hand_to([("j", claimed.token, "other")]) == 0
    assert store.claim("old", ["celery"], 10) == []
    assert store.claim("legacy", ["celery"], 10) == []
    [taken] = store.claim("new", ["celery"], 10)
    # The claim it was handed from is not counted: it finished, as a deferral does.
    assert (taken.job_id, taken.claims) == ("j", 1)

    # Handed back by that node in the usual way, it is anyone's again.
    assert store.defer([("j", taken.token, datetime.now(timezone.utc) - timedelta(seconds=1))])
    [again] = store.claim("old", ["celery"], 10)
    assert again.job_id == "j"


def test_other_jobs_of_the_queue_are_claimed_by_any_node_meanwhile(store: Store) -> None:
    _register(store)
    store.enqueue_many([new_job("handed", task="acc.next"), new_job("plain", priority=0)])
    [claimed] = store.claim("old", ["celery"], 1)
    assert claimed.job_id == "handed"  # the higher priority first
    store.hand_to([("handed", claimed.token, "new")])
    assert [j.job_id for j in store.claim("old", ["celery"], 10)] == ["plain"]
    assert [j.job_id for j in store.claim("new", ["celery"], 10)] == ["handed"]


def test_a_job_handed_to_a_node_that_is_removed_is_anyones_again(store: Store) -> None:
    _register(store)
    store.enqueue(new_job("j", task="acc.next"))
    [claimed] = store.claim("old", ["celery"], 10)
    store.hand_to([("j", claimed.token, "new")])
    store.remove_node("new")
    assert [j.job_id for j in store.claim("old", ["celery"], 10)] == ["j"]


def test_a_job_handed_to_a_node_declared_dead_is_anyones_again(store: Store) -> None:
    _register(store)
    store.enqueue(new_job("j", task="acc.next"))
    [claimed] = store.claim("old", ["celery"], 10)
    store.hand_to([("j", claimed.token, "new")])
    assert store.claim("old", ["celery"], 10) == []
    _silence(store, "new")
    recovered = store.recover_orphans(60)
    assert recovered.dead_nodes == ["new"]
    assert recovered.requeued == []  # it was pending, not running
    assert [j.job_id for j in store.claim("old", ["celery"], 10)] == ["j"]


def test_a_handed_job_that_needs_a_permit_gives_its_permit_back(store: Store) -> None:
    _register(store)
    store.enqueue_many([new_job("r1", task="acc.next", resource="api")])
    [claimed] = store.claim_for_resource("old", ["celery"], "api", 1, 10)
    store.hand_to([("r1", claimed.token, "new")])
    assert store.claim_for_resource("old", ["celery"], "api", 1, 10) == []
    [taken] = store.claim_for_resource("new", ["celery"], "api", 1, 10)
    assert taken.job_id == "r1"


def test_a_node_with_many_tasks_registers(store: Store) -> None:
    """1,500 long task names (about 100 KB of JSON): MySQL's TEXT (64 KB) refused the node's
    registration, and the worker never claimed."""
    names = [
        f"project.apps.module_{i:04d}.tasks.some_reasonably_long_task_name" for i in range(1500)
    ]
    store.register_node("big", "h", 1, ["celery"], 1, task_names=names)
    assert store.nodes_knowing(names[-1], "celery", 60) == ["big"]


def test_a_node_table_of_an_earlier_version_gains_task_names(store: JobStore) -> None:
    with store.engine.connect() as conn:
        conn.execute(text("ALTER TABLE scheduler_node DROP COLUMN task_names"))
        if store.engine.dialect.name != "sqlite":
            conn.commit()
    assert "missing column scheduler_node.task_names" in store.schema_differences()
    assert store.create_missing_tables() == ["scheduler_node.task_names"]
    assert store.schema_differences() == []
    store.register_node("new", "h", 2, ["celery"], 1, task_names=["acc.next"])
    assert store.nodes_knowing("acc.next", "celery", 60) == ["new"]


def test_hand_overs_do_not_count_toward_the_recovery_limit(store: Store) -> None:
    """Handed over three times, each new node dying under it: three claims that never
    finished, within ratchet_max_recoveries = 5 (counted, it was dead-lettered at 3)."""
    store.register_node("old", "h", 1, ["celery"], 1, task_names=["acc.add"])
    store.enqueue(new_job("j", task="acc.next"))
    for crash in range(3):
        node = f"new{crash}"
        store.register_node(node, "h", 2 + crash, ["celery"], 1, task_names=["acc.next"])
        [claimed] = store.claim("old", ["celery"], 10)
        store.hand_to([("j", claimed.token, node)])
        [_taken] = store.claim(node, ["celery"], 10)
        _silence(store, node)  # the new worker dies running it
        store.recover_orphans(60, max_recoveries=5)
    record = store.result("j")
    assert record is not None
    assert record.status is not JobStatus.FAILED, record.last_error


def test_a_job_handed_to_a_node_that_stops_serving_its_queue_is_anyones_again(
    store: Store,
) -> None:
    """``cancel_consumer`` of the job's queue on the node it was handed to: another node
    that knows the task claims it (it waited for as long as that node lived)."""
    store.register_node("old", "h", 1, ["celery"], 1, task_names=["acc.add"])
    store.register_node("new1", "h", 2, ["celery", "other"], 1, task_names=["acc.next"])
    store.register_node("new2", "h", 3, ["celery"], 1, task_names=["acc.next"])
    store.enqueue(new_job("j", task="acc.next"))
    store.enqueue(new_job("k", task="acc.next", queue="other"))
    [claimed] = store.claim("old", ["celery"], 10)
    [kept] = store.claim("old", ["other"], 10)
    assert store.hand_to([("j", claimed.token, "new1"), ("k", kept.token, "new1")]) == 2
    store.set_node_queues("new1", ["other"])  # celery control cancel_consumer celery
    assert store.nodes_knowing("acc.next", "celery", 60, excluding="old") == ["new2"]
    [taken] = store.claim("new2", ["celery"], 10)
    assert taken.job_id == "j"
    # The job of a queue it still serves stays its own.
    assert store.claim("new2", ["other"], 10) == []
    assert [c.job_id for c in store.claim("new1", ["other"], 10)] == ["k"]


@pytest.mark.parametrize("stored", ["not json", '{"acc.next": true}', "[1, null]", '"acc.next"'])
def test_a_task_list_written_by_hand_that_is_not_a_list_of_names_says_nothing(
    store: JobStore, stored: str
) -> None:
    """A node row whose task_names is not a JSON list of names (written by hand, or by a
    tool) is read as a node that said nothing: no job is handed to it, and nothing fails."""
    store.register_node("odd", "h", 1, ["celery"], 1, task_names=["acc.next"])
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduler_node SET task_names = :v WHERE node_id = 'odd'"), {"v": stored}
        )
    assert store.nodes_knowing("acc.next", "celery", 60) == []


def test_a_job_handed_to_another_node_is_not_due_for_this_one(store: Store) -> None:
    """An idle node sleeps until its queues' next due job; a job handed to another node,
    which it cannot claim, made it look again every poll interval for as long as the job
    waited (an overdue job is looked at after the shortest backoff)."""
    _register(store)
    store.enqueue(new_job("j", task="acc.next"))
    [claimed] = store.claim("old", ["celery"], 10)
    assert store.hand_to([("j", claimed.token, "new")]) == 1

    assert store.next_due_in(["celery"], "old") is None
    due_for_new = store.next_due_in(["celery"], "new")
    assert due_for_new is not None and due_for_new <= 0
    due_for_anyone = store.next_due_in(["celery"])  # no node named: every pending job
    assert due_for_anyone is not None and due_for_anyone <= 0
