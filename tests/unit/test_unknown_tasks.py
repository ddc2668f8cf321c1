"""Jobs of a task the node does not know: handed back within the grace period from the
node's first refusal of each, for longer each time, then failed; the task named once."""

from __future__ import annotations

from celery_ratchet.domain.unknown_tasks import UnknownTasks


def test_each_job_is_handed_back_for_the_grace_period_from_its_own_first_refusal() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert tasks.hand_back("a", now=0)
    assert tasks.hand_back("a", now=599)
    assert tasks.hand_back("b", now=300)  # its own clock
    assert tasks.hand_back("a", now=600) is None
    assert tasks.hand_back("b", now=899)
    assert tasks.hand_back("b", now=900) is None


def test_no_grace_fails_at_once() -> None:
    assert UnknownTasks(grace_seconds=0).hand_back("a", now=0) is None


def test_a_job_refused_again_is_handed_back_for_longer_up_to_a_minute() -> None:
    """A backlog of a task no node knows costs a claim and a hand-back per job a minute at
    most, not one every five seconds for the whole grace period."""
    tasks = UnknownTasks(grace_seconds=600)
    now, delays = 0.0, []
    while (delay := tasks.hand_back("a", now)) is not None:
        delays.append(delay)
        now += delay
    assert delays[:5] == [5, 10, 20, 40, 60]
    assert set(delays[4:]) == {60}
    assert len(delays) <= 15  # 120 at five seconds each
    assert tasks.hand_back("b", now) == 5  # each job its own count


def test_the_task_is_named_once() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert [tasks.first_of(n) for n in ("x", "x", "y", "x")] == [True, False, True, False]


def test_jobs_not_seen_again_are_forgotten() -> None:
    tasks = UnknownTasks(grace_seconds=10)
    for n in range(1000):
        tasks.hand_back(f"ran-elsewhere-{n}", now=0)
    tasks.hand_back("late", now=100)
    assert tasks.hand_back("late", now=105)  # its clock kept
    assert len(tasks._refused) == 1
