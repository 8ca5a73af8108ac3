"""The socket thread's one walk of a Call (calls._scan) against the general walks it stands for.

A quick op's arguments are resolved, their elements counted and what decides its results
keyed in one walk; the key must be the one the general path makes (_ufunc_key of the
resolved arguments, or _value_key of the command's), since both fill the same cache of
result Specs, and anything the walk does not take must go the general way.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mwrt import ops
from mwrt.protocol import wire
from mwrt.worker import calls

TABLE = {1: np.ones((2, 3)), 2: np.arange(3.0), 3: np.zeros((), np.int32),
         4: np.ones(4, bool)}
Ref = wire.Ref

TAKEN = [
    ("multiply", (Ref(1), Ref(2)), {}),
    ("add", (Ref(1), 2.5), {}),
    ("maximum", (7, Ref(3)), {}),
    ("add", (Ref(4), True), {}),
    ("multiply", (Ref(2), 1j), {}),
    ("add", (Ref(1), Ref(2)), {"dtype": "<f4"}),  # keywords: keyed by value
    ("sum", (Ref(1),), {"axis": 0}),
    ("mean", (Ref(1),), {"axis": None, "keepdims": True}),
    ("clip", (Ref(2), None, 1.0), {}),
    ("astype", (Ref(1), "<f4"), {}),
]

FALLS_BACK = [
    ("sum", (Ref(99),), {}),  # a missing tensor: the general path names it
    ("sum", (Ref(1),), {"axis": (0, 1)}),  # a tuple
    ("getitem", (Ref(2), np.array([True, False, True])), {}),  # an array sent by value
    ("reshape", (Ref(1), (3, 2)), {}),
    ("add", (Ref(1), None), {}),  # not a number: a ufunc's key is its operands' types
]


def _call(name, args, kwargs) -> wire.Call:
    return wire.Call(id=1, stream=-1, outs=(9,), op=name, args=args, kwargs=kwargs)


def _general_key(name, args, kwargs):
    op = ops.get(name)
    if op.by_type and not kwargs:
        return calls._ufunc_key(op, tuple(TABLE[a.id] if type(a) is Ref else a for a in args))
    return calls._value_key(name, args, kwargs, TABLE)


@pytest.mark.parametrize("name, args, kwargs", TAKEN)
def test_the_one_walk_resolves_counts_and_keys_as_the_general_walks(name, args, kwargs):
    op = ops.get(name)
    got = calls._scan(TABLE, _call(name, args, kwargs), op.by_type and not kwargs)
    assert got is not None
    resolved, named, count, key = got
    want = tuple(TABLE[a.id] if type(a) is Ref else a for a in args)
    assert len(resolved) == len(want) and all(x is y for x, y in zip(resolved, want))
    assert named == kwargs
    assert count == calls._elements(want, 10**9)
    assert key == _general_key(name, args, kwargs) and key is not None


@pytest.mark.parametrize("name, args, kwargs", FALLS_BACK)
def test_what_the_one_walk_does_not_take_goes_the_general_way(name, args, kwargs):
    op = ops.get(name)
    assert calls._scan(TABLE, _call(name, args, kwargs), op.by_type and not kwargs) is None


_PLAIN_ARGS = st.one_of(st.sampled_from([Ref(1), Ref(2), Ref(3), Ref(4)]), st.integers(),
                        st.floats(allow_nan=False), st.booleans(), st.none(),
                        st.text(max_size=3))


@given(st.lists(_PLAIN_ARGS, max_size=4),
       st.dictionaries(st.sampled_from(["axis", "keepdims", "dtype"]),
                       st.one_of(st.integers(), st.booleans(), st.none()), max_size=2))
def test_any_plain_call_is_keyed_as_the_general_walk_keys_it(args, kwargs):
    got = calls._scan(TABLE, _call("sum", tuple(args), kwargs), False)
    assert got is not None and got[3] == _general_key("sum", tuple(args), kwargs)
