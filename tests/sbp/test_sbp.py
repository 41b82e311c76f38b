"""SBP values are interned singletons: one object per value, whichever way it is made
(constructor, `flow.sbp` name, call, pickle in this or another process, copy, threads)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import threading

import pytest

import sbpflow as flow
from sbpflow.sbp import B, Broadcast, P, PartialSum, S, Split
from tests.mpijob import REPO


def test_every_way_of_naming_a_value_gives_the_one_object():
    assert Broadcast() is B and Broadcast() is Broadcast()
    assert PartialSum() is P and PartialSum() is PartialSum()
    assert flow.sbp.broadcast is B and flow.sbp.broadcast() is B
    assert flow.sbp.partial_sum is P and flow.sbp.partial_sum() is P
    assert Split(0) is S(0) is flow.sbp.split(0) is flow.sbp.split(0)()
    assert Split(37) is S(37)  # an axis not made up front
    assert S(0) is not S(1) and B is not P
    assert S(0) != S(1) and S(0) != B and B != P and B == Broadcast() and S(2) == Split(2)
    assert hash(S(3)) == hash(Split(3)) and hash(B) == hash(Broadcast())


def test_pickle_and_copies_keep_identity():
    values = (B, P, S(0), S(5), S(123))
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(values, protocol=proto))
        assert all(x is y for x, y in zip(back, values)), proto
    assert all(copy.copy(x) is x for x in values)
    assert all(x is y for x, y in zip(copy.deepcopy(values), values))
    nested = {"sbp": [(S(1), B)], "p": P}
    assert copy.deepcopy(nested)["sbp"][0][0] is S(1) and copy.deepcopy(nested)["p"] is P


def test_unpickled_in_a_fresh_process_they_are_that_process_singletons():
    blob = pickle.dumps((B, P, S(0), S(9)))
    code = (
        "import pickle, sys\n"
        "from sbpflow.sbp import B, P, S\n"
        "got = pickle.loads(sys.stdin.buffer.read())\n"
        "print(got[0] is B, got[1] is P, got[2] is S(0), got[3] is S(9))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                         cwd=REPO, timeout=120, check=True)
    assert out.stdout.decode().split() == ["True"] * 4


def test_threads_making_a_new_axis_at_once_get_one_object():
    axis = next(a for a in range(1000, 2000) if a not in Split._interned)  # a new axis
    got, start = [], threading.Barrier(8)

    def make():
        start.wait()
        got.append(Split(axis))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(x is got[0] for x in got)


def test_values_are_immutable_and_bad_axes_are_refused():
    with pytest.raises(AttributeError, match="immutable"):
        S(0).axis = 1
    with pytest.raises(AttributeError, match="immutable"):
        B.x = 1
    assert S(0).axis == 0
    for bad in (-1, True, 1.0, "0"):
        with pytest.raises(ValueError, match="split\\(\\): axis must be a non-negative int"):
            Split(bad)
