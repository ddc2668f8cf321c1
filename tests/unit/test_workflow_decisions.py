"""The rules that decide a workflow's branches when its parent ends (domain/workflow.py)."""

from __future__ import annotations

from celery_ratchet.domain.workflow import (
    FAILURE,
    JOIN,
    RESULT,
    SUCCESS,
    WAITING,
    Branch,
    Send,
    Verdict,
    decide_branches,
    fires_on_outcome,
)


def _branch(
    position: int,
    kind: str,
    name: str | None = None,
    waits_for: tuple[str, ...] = (),
    state: str = WAITING,
) -> Branch:
    return Branch(position, kind, name, None, waits_for, "{}", state)


def test_success_and_failure_branches_fire_on_the_parents_outcome() -> None:
    success, failure, result = _branch(0, SUCCESS), _branch(1, FAILURE), _branch(2, RESULT)
    assert [fires_on_outcome(b, failed=False) for b in (success, failure)] == [True, False]
    assert [fires_on_outcome(b, failed=True) for b in (success, failure)] == [False, True]
    assert fires_on_outcome(result, failed=False) is None  # its predicate decides
    assert fires_on_outcome(result, failed=True) is False
    assert fires_on_outcome(_branch(3, "FORGED"), failed=False) is False


def test_fired_branches_fan_out_in_order_and_the_rest_are_skipped_or_refused() -> None:
    branches = [_branch(0, SUCCESS), _branch(1, FAILURE), _branch(2, RESULT), _branch(3, RESULT)]
    verdicts = {0: Verdict.FIRES, 1: Verdict.SKIPPED, 2: Verdict.REFUSED, 3: Verdict.FIRES}
    decisions = decide_branches(branches, verdicts)
    assert decisions.states == {0: "FIRED", 1: "SKIPPED", 2: "FAILED", 3: "FIRED"}
    assert decisions.sends({0, 1, 2, 3}) == [Send(0), Send(3)]


def test_a_join_is_sent_with_the_branches_it_names_that_fired_and_they_not_alone() -> None:
    branches = [
        _branch(0, SUCCESS, "a"),
        _branch(1, RESULT, "b"),
        _branch(2, SUCCESS, "c"),
        _branch(3, JOIN, waits_for=("b", "a")),
    ]
    verdicts = {0: Verdict.FIRES, 1: Verdict.FIRES, 2: Verdict.FIRES}
    decisions = decide_branches(branches, verdicts)
    assert decisions.states[3] == "FIRED"
    assert decisions.sends({0, 1, 2, 3}) == [Send(2), Send(3, (1, 0), is_join=True)]


def test_a_join_none_of_whose_branches_fired_is_sent_alone() -> None:
    branches = [_branch(0, SUCCESS, "a"), _branch(1, JOIN, waits_for=("a",))]
    decisions = decide_branches(branches, {0: Verdict.SKIPPED})
    assert decisions.sends({0, 1}) == [Send(1, (), is_join=True)]


def test_branches_decided_already_are_left_out() -> None:
    branches = [_branch(0, SUCCESS, "a", state="FIRED"), _branch(1, SUCCESS, "b")]
    decisions = decide_branches(branches, {1: Verdict.FIRES})
    assert decisions.states == {1: "FIRED"}
    assert decisions.sends({1}) == [Send(1)]


def test_what_a_concurrent_run_decided_first_it_sends_and_this_run_does_not() -> None:
    branches = [_branch(0, SUCCESS, "a"), _branch(1, SUCCESS), _branch(2, JOIN, waits_for=("a",))]
    decisions = decide_branches(branches, {0: Verdict.FIRES, 1: Verdict.FIRES})
    # The other run wrote the join's decision first: this run's "a" goes alone.
    assert decisions.sends({0, 1}) == [Send(0), Send(1)]
    # It wrote "a" first: this run's join goes without it.
    assert decisions.sends({1, 2}) == [Send(1), Send(2, (), is_join=True)]
