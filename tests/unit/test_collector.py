"""The collector is held off for a block and turned on again after it, only if it was on."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from celery_ratchet.celery.send.collector import paused_collection


@pytest.fixture(autouse=True)
def collection_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_collection_is_off_in_the_block_and_on_after_it() -> None:
    gc.enable()
    with paused_collection():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collection_is_on_again_after_a_block_that_raised() -> None:
    gc.enable()
    with pytest.raises(KeyError), paused_collection():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_caller_that_turned_collection_off_keeps_it_off() -> None:
    gc.disable()
    with paused_collection():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_turn_collection_on_once_the_last_ends() -> None:
    gc.enable()
    outer = paused_collection()
    outer.__enter__()
    with paused_collection():
        assert not gc.isenabled()
    assert not gc.isenabled()
    outer.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_child_forked_during_a_pause_collects() -> None:
    import os

    gc.enable()
    with paused_collection():
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
