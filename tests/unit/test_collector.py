"""collector_paused (make_plan, build_snapshot) pauses the cyclic garbage collector and gives it back
as it found it."""

from __future__ import annotations

import gc

from m2g.model.collector import collector_paused


def test_collector_paused_and_restored() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one keeps the outer state
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_restored_after_an_error() -> None:
    try:
        with collector_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()
