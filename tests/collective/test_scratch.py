"""Scratch buffers are reused between calls, lent to one caller at a time, and never lent
again after a failure (a receive may still be posted into them)."""

from __future__ import annotations

import numpy as np
import pytest

from mwrt.collective.scratch import KEEP, scratch


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_comes_back_for_the_next_call():
    with scratch(1000, np.float32) as a:
        first = _address(a)
    with scratch(500, np.float64) as b:  # 4000 bytes fit in the same buffer
        assert _address(b) == first and b.dtype == np.float64 and b.size == 500


def test_nested_callers_get_different_buffers():
    with scratch(100, np.int32) as a, scratch(100, np.int32) as b:
        assert _address(a) != _address(b)


def test_a_failed_caller_does_not_return_its_buffer():
    with pytest.raises(RuntimeError):
        with scratch(12345, np.uint8) as a:
            lost = _address(a)
            raise RuntimeError("a peer died mid-collective")
    for _ in range(KEEP + 1):  # `a` stays alive, so malloc cannot hand its address out again
        with scratch(12345, np.uint8) as b:
            assert _address(b) != lost
    assert a.size == 12345
