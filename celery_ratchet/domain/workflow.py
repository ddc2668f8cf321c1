"""A conditional workflow's branches, and what its parent's end makes of them: pure rules.

A workflow stores its branches with its parent job (``celery_ratchet.workflow()``). When the
parent ends, each undecided branch is judged once, in order: it fires, is skipped, or is
refused (its stored predicate is not one the application allowed). A join fires with the
branches it names that fired: they are sent as its chord's header, not on their own; a join
none of whose branches fired is sent alone, with an empty list.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

SUCCESS, FAILURE, RESULT, JOIN = "SUCCESS", "FAILURE", "RESULT", "JOIN"
WAITING, FIRED, SKIPPED, FAILED = "WAITING", "FIRED", "SKIPPED", "FAILED"


@dataclass(frozen=True)
class Branch:
    """A stored branch of a workflow."""

    position: int
    kind: str
    name: str | None
    predicate: str | None
    #: A join's branch names.
    waits_for: tuple[str, ...]
    #: The branch's signature, encoded.
    encoded: str
    state: str


class Verdict(enum.Enum):
    FIRES = FIRED
    SKIPPED = SKIPPED
    REFUSED = FAILED


def fires_on_outcome(branch: Branch, failed: bool) -> bool | None:
    """Whether a success or failure branch fires on the parent's outcome; None for a branch
    decided by its predicate (a result branch: never on a failure)."""
    if branch.kind == SUCCESS:
        return not failed
    if branch.kind == FAILURE:
        return failed
    if branch.kind != RESULT or failed:  # a kind of no known meaning never fires
        return False
    return None


@dataclass(frozen=True)
class Send:
    """A branch to send: alone, or a join with the fired branches it waits for."""

    position: int
    #: A join's members that fired, by position, in the order the join names them.
    members: tuple[int, ...] = ()
    is_join: bool = False


@dataclass(frozen=True)
class Decisions:
    #: The state each undecided branch moves to, by position.
    states: dict[int, str]
    #: The branches that fire, in order (a join's among them).
    fired: tuple[int, ...]
    #: Each join, with the branches it names that fire, in the order it names them.
    joins: tuple[tuple[int, tuple[int, ...]], ...]

    def sends(self, decided: Collection[int]) -> list[Send]:
        """What to send, given the branches whose decision this run wrote: a concurrent run
        of the same decision may have written some first, and sends those itself. A fired
        branch goes in its join when this run decided the join too, else alone."""
        alone = [p for p in self.fired if p in decided]
        joins = []
        for position, members in self.joins:
            if position not in decided:
                continue
            taken = tuple(m for m in members if m in alone)
            alone = [p for p in alone if p not in taken]
            joins.append(Send(position, taken, is_join=True))
        return [*(Send(p) for p in alone), *joins]


def decide_branches(branches: Sequence[Branch], verdicts: Mapping[int, Verdict]) -> Decisions:
    """The decisions for the waiting branches; ``verdicts`` judge every waiting branch that
    is no join (a join always fires)."""
    states: dict[int, str] = {}
    fired: list[int] = []
    fired_by_name: dict[str, int] = {}
    for branch in branches:
        if branch.kind == JOIN or branch.state != WAITING:
            continue
        verdict = verdicts[branch.position]
        states[branch.position] = verdict.value
        if verdict is Verdict.FIRES:
            fired.append(branch.position)
            if branch.name:
                fired_by_name[branch.name] = branch.position
    joins = []
    for branch in branches:
        if branch.kind != JOIN or branch.state != WAITING:
            continue
        states[branch.position] = FIRED
        joins.append(
            (
                branch.position,
                tuple(fired_by_name[n] for n in branch.waits_for if n in fired_by_name),
            )
        )
    return Decisions(states, tuple(fired), tuple(joins))
