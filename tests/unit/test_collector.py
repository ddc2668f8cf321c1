"""The collector is held off for a block and turned on again after it, only if it was on."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from celery_ratchet.celery.collector import paused_collection


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
