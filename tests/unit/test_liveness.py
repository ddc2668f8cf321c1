"""Judging other nodes dead from heartbeats this node saw stand still, and the fence the
executing processes read before a job starts."""

from __future__ import annotations

import os

from celery_ratchet.domain.liveness import LivenessJudge
from celery_ratchet.runtime.fence import Fence, new_tag, stamp

GRACE = 60.0


def test_a_node_is_silent_only_after_its_heartbeat_stood_still_for_a_full_grace() -> None:
    judge: LivenessJudge[int] = LivenessJudge(GRACE, "me")
    judge.observe({"me": 1, "a": 7, "b": 3}, now=0.0)
    judge.observe({"me": 2, "a": 7, "b": 4}, now=30.0)
    assert judge.silent(59.0) == {}
    judge.observe({"me": 3, "a": 7, "b": 5}, now=60.0)
    # "b" beats, "me" is never judged; "a" stood still for a grace period.
    assert judge.silent(60.0) == {"a": 7}


def test_after_losing_contact_a_node_judges_nobody_for_a_full_grace() -> None:
    judge: LivenessJudge[int] = LivenessJudge(GRACE, "me")
    judge.observe({"a": 7}, now=0.0)
    judge.lost_contact()  # the database was away from 10 to 100
    judge.observe({"a": 7}, now=100.0)
    assert not judge.may_judge(100.0) and judge.silent(100.0) == {}
    judge.observe({"a": 7}, now=159.0)
    assert judge.silent(159.0) == {}
    assert judge.may_judge(160.0) and judge.silent(160.0) == {"a": 7}


def test_a_node_that_just_started_judges_nobody_for_a_full_grace() -> None:
    judge: LivenessJudge[int] = LivenessJudge(GRACE, "me")
    assert not judge.may_judge(0.0)
    judge.observe({"a": 1}, now=5.0)
    assert not judge.may_judge(64.0) and judge.may_judge(65.0)


def test_the_fence_vouches_for_the_current_epoch_until_its_moment() -> None:
    fence, tag = Fence(), new_tag()
    assert not fence.vouches(stamp(tag, 1), 0.0)  # nothing published yet
    fence.publish(tag, 1, 100.0)
    assert fence.vouches(stamp(tag, 1), 99.0)
    assert not fence.vouches(stamp(tag, 1), 100.0)
    assert not fence.vouches(stamp(tag, 2), 99.0)
    assert not fence.vouches(stamp(new_tag(), 1), 99.0)  # another node of this process
    assert not fence.vouches(None, 0.0)
    fence.publish(tag, -1, 0.0)  # declared dead
    assert not fence.vouches(stamp(tag, 1), 0.0)


def test_pool_processes_forked_before_a_heartbeat_read_what_their_parent_published() -> None:
    fence, tag = Fence(), new_tag()
    go, answer = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.read(go[0], 1)
        vouched = fence.vouches(stamp(tag, 2), 0.0) and not fence.vouches(stamp(tag, 1), 0.0)
        os.write(answer[1], b"1" if vouched else b"0")
        os._exit(0)
    fence.publish(tag, 2, 1e12)  # published after the fork, as every heartbeat is
    os.write(go[1], b"x")
    result = os.read(answer[0], 1)
    os.waitpid(child, 0)
    assert result == b"1"
