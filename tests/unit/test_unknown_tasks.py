"""Jobs of a task the node does not know: handed back within the grace period from the
node's first refusal of each, then failed; the task named once."""

from __future__ import annotations

from celery_ratchet.domain.unknown_tasks import UnknownTasks


def test_each_job_is_handed_back_for_the_grace_period_from_its_own_first_refusal() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert tasks.hand_back("a", now=0)
    assert tasks.hand_back("a", now=599)
    assert tasks.hand_back("b", now=300)  # its own clock
    assert not tasks.hand_back("a", now=600)
    assert tasks.hand_back("b", now=899)
    assert not tasks.hand_back("b", now=900)


def test_no_grace_fails_at_once() -> None:
    assert not UnknownTasks(grace_seconds=0).hand_back("a", now=0)


def test_the_task_is_named_once() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert [tasks.first_of(n) for n in ("x", "x", "y", "x")] == [True, False, True, False]


def test_jobs_not_seen_again_are_forgotten() -> None:
    tasks = UnknownTasks(grace_seconds=10)
    for n in range(1000):
        tasks.hand_back(f"ran-elsewhere-{n}", now=0)
    tasks.hand_back("late", now=100)
    assert tasks.hand_back("late", now=105)  # its clock kept
    assert len(tasks._first_refused) == 1
