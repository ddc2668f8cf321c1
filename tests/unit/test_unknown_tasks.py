"""Jobs of a task the node does not know: handed to a live node that knows the task while
one does, with no grace running; else handed back within the grace period from the node's
first refusal of each, for longer each time, then failed; the task named once."""

from __future__ import annotations

from celery_ratchet.domain.unknown_tasks import (
    KNOWING_FRESH_SECONDS,
    HandBack,
    HandTo,
    UnknownTasks,
)


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


def test_while_a_live_node_knows_the_task_its_jobs_go_there_and_never_fail() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    for now in (0.0, 599.0, 600.0, 10_000.0):
        assert tasks.decide("a", ["new-1"], now) == HandTo("new-1")
    assert tasks._refused == {}  # no grace clock runs


def test_jobs_are_spread_over_the_nodes_that_know_the_task_the_same_way_each_time() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    nodes = ["new-2", "new-1", "new-3"]
    chosen = {tasks.decide(f"job-{n}", nodes, 0) for n in range(200)}
    assert chosen == {HandTo("new-1"), HandTo("new-2"), HandTo("new-3")}
    assert tasks.decide("job-7", nodes, 0) == tasks.decide("job-7", list(reversed(nodes)), 5)


def test_with_no_node_that_knows_it_the_grace_path_holds() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert tasks.decide("a", [], 0) == HandBack(5)
    assert tasks.decide("a", [], 5) == HandBack(10)
    assert tasks.decide("a", [], 600) is None


def test_a_refused_job_handed_over_later_starts_a_fresh_grace_if_the_node_goes() -> None:
    """A job refused while no node knew the task, then handed to one that came: its grace
    clock is gone; were that node to leave, the job's clock starts again from then."""
    tasks = UnknownTasks(grace_seconds=600)
    assert tasks.decide("a", [], 0) == HandBack(5)
    assert tasks.decide("a", ["new-1"], 500) == HandTo("new-1")
    assert tasks.decide("a", [], 700) == HandBack(5)
    assert tasks.decide("a", [], 1299) is not None
    assert tasks.decide("a", [], 1300) is None


def test_what_was_read_of_the_nodes_is_reused_for_a_few_seconds_per_task_and_queue() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert tasks.knowing("t", "q", 0) is None
    tasks.remember("t", "q", ["new-1"], 0)
    assert tasks.knowing("t", "q", KNOWING_FRESH_SECONDS - 0.1) == ["new-1"]
    assert tasks.knowing("t", "other", 1) is None
    assert tasks.knowing("u", "q", 1) is None
    assert tasks.knowing("t", "q", KNOWING_FRESH_SECONDS) is None


def test_the_hand_over_is_named_once_per_task() -> None:
    tasks = UnknownTasks(grace_seconds=600)
    assert [tasks.first_handed(n) for n in ("x", "x", "y")] == [True, False, True]
    assert tasks.first_of("x")  # the grace path's own message is apart
