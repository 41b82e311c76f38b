"""A weights-only load of a whole-object file builds no more than about the file's size.

Each hostile stream below is written by hand with pickle opcodes into a safetensors container
(made with safetensors itself, so the test does not depend on sbpflow's writer) and must be
refused with pickle.UnpicklingError before the allocation it asks for, while the memory
traced during the load stays small. Legitimate whole objects with large bytes, sets and
repeated tensors still load.
"""

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import safetensors.numpy

import sbpflow as flow

ENTRY = "__sbpflow_pickle__"
MiB = 1 << 20


def _container(stream: bytes, **arrays) -> bytes:
    arrays[ENTRY] = np.frombuffer(stream, np.uint8).copy()
    meta = {"sbpflow": json.dumps({"version": 1, "root": {"P": ENTRY}}), "format": "pt"}
    return safetensors.numpy.save(arrays, metadata=meta)


def _long1(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return pickle.LONG1 + bytes([len(raw)]) + raw


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _binunicode(text: str) -> bytes:
    raw = text.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


P2 = pickle.PROTO + b"\x02"
BIG = 1 << 27  # 128 MiB: what each stream asks for, refused before it is allocated

HOSTILE = {
    "bytearray(n) by REDUCE":
        P2 + _global("builtins", "bytearray") + _long1(BIG) + pickle.TUPLE1 + pickle.REDUCE
        + pickle.STOP,
    "bytes(n) by REDUCE":
        P2 + _global("builtins", "bytes") + _long1(BIG) + pickle.TUPLE1 + pickle.REDUCE
        + pickle.STOP,
    "bytes(n) by NEWOBJ":
        P2 + _global("builtins", "bytes") + _long1(BIG) + pickle.TUPLE1 + pickle.NEWOBJ
        + pickle.STOP,
    "bytes(n) by INST":
        pickle.MARK + _long1(BIG) + pickle.INST + b"builtins\nbytes\n" + pickle.STOP,
    "BYTEARRAY8 of n":
        pickle.PROTO + b"\x05" + pickle.BYTEARRAY8 + struct.pack("<Q", BIG) + pickle.STOP,
    # 3000 calls of bytes(20000): each small, together 60 MB from a 24 kB stream
    "bytes() again and again":
        P2 + _global("builtins", "bytes") + pickle.BINPUT + b"\x00" + pickle.MARK
        + (pickle.BINGET + b"\x00" + _long1(20000) + pickle.TUPLE1 + pickle.REDUCE) * 3000
        + pickle.LIST + pickle.STOP,
    # one 20000-character string, turned into a list 3000 times through the memo
    "list() of one memoised string, again and again":
        P2 + _global("builtins", "list") + pickle.BINPUT + b"\x00" + _binunicode("a" * 20000)
        + pickle.BINPUT + b"\x01" + pickle.POP + pickle.MARK
        + (pickle.BINGET + b"\x00" + pickle.BINGET + b"\x01" + pickle.TUPLE1
           + pickle.REDUCE) * 3000 + pickle.LIST + pickle.STOP,
    # str() of a list holding one 20000-character string 20000 times: 400 MB of text
    "str() of a list of repeated references":
        P2 + _global("builtins", "str") + _binunicode("a" * 20000) + pickle.BINPUT + b"\x01"
        + pickle.POP + pickle.MARK + (pickle.BINGET + b"\x01") * 20000 + pickle.LIST
        + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP,
    # lst[0:0] = a 5000-element list, 3000 times over
    "slice assignment through SETITEM":
        P2 + pickle.EMPTY_LIST + pickle.BINPUT + b"\x00" + pickle.MARK
        + pickle.BININT1 + b"\x01" + pickle.DUP * 4999 + pickle.LIST + pickle.BINPUT + b"\x01"
        + pickle.POP + _global("builtins", "slice") + pickle.BININT1 + b"\x00" + pickle.DUP
        + pickle.TUPLE2 + pickle.REDUCE + pickle.BINPUT + b"\x02" + pickle.POP
        + (pickle.BINGET + b"\x02" + pickle.BINGET + b"\x01" + pickle.SETITEM) * 3000
        + pickle.STOP,
    "BINBYTES8 longer than the stream":
        pickle.PROTO + b"\x04" + pickle.BINBYTES8 + struct.pack("<Q", 1 << 40) + pickle.STOP,
    "FRAME longer than the stream":
        pickle.PROTO + b"\x04" + pickle.FRAME + struct.pack("<Q", 1 << 40) + pickle.NONE
        + pickle.STOP,
    # the C unpickler sizes its memo array from the index: 2**31 slots of 8 bytes
    "LONG_BINPUT at a huge index":
        P2 + pickle.NONE + pickle.LONG_BINPUT + struct.pack("<I", 1 << 31) + pickle.POP
        + _global("builtins", "bytes") + _long1(BIG) + pickle.TUPLE1 + pickle.REDUCE
        + pickle.STOP,
}


def _traced_load(data: bytes):
    tracemalloc.start()
    try:
        try:
            out = flow.load(io.BytesIO(data))
        except pickle.UnpicklingError as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_stream_is_refused_before_it_allocates(name):
    data = _container(HOSTILE[name])
    assert len(data) < 64_000  # small files: the asks are 100s of MB
    err, peak = _traced_load(data)
    assert isinstance(err, pickle.UnpicklingError), f"{name}: loaded {type(err).__name__}"
    msg = str(err)
    assert msg.startswith("Weights only load failed")
    assert any(k in msg for k in ("may build in a weights-only load", "truncated",
                                  "is not built by a weights-only load")), msg
    assert peak < 8 * MiB, f"{name}: {peak / MiB:.1f} MiB traced while refusing it"


def test_the_charge_names_the_call_and_the_limit():
    data = _container(HOSTILE["bytearray(n) by REDUCE"])
    err, _ = _traced_load(data)
    stream = len(HOSTILE["bytearray(n) by REDUCE"])
    assert f"bytearray() would make {BIG} more elements" in str(err)
    assert f"past what a {stream}-byte pickle stream may build" in str(err)


def test_a_repeated_array_reference_is_copied_once():
    """Every persistent id of one NumPy entry loads as the same array: 5000 three-byte
    references to a 4 MB entry must not make 5000 copies."""
    pid = (P2[:0] + pickle.MARK + _binunicode("sbpflow") + pickle.BININT1 + b"\x01"
           + _binunicode("ndarray") + _binunicode("big") + pickle.NEWFALSE + pickle.TUPLE)
    stream = (P2 + pickle.MARK + pid + pickle.BINPUT + b"\x00" + pickle.BINPERSID
              + (pickle.BINGET + b"\x00" + pickle.BINPERSID) * 5000 + pickle.LIST + pickle.STOP)
    data = _container(stream, big=np.arange(1 << 20, dtype=np.float32))
    out, peak = _traced_load(data)
    assert isinstance(out, list) and len(out) == 5001
    assert all(a is out[0] for a in out)
    np.testing.assert_array_equal(out[0], np.arange(1 << 20, dtype=np.float32))
    assert peak < 3 * (4 * MiB) + 8 * MiB  # the entry, its copy, and a little


class Holder:
    """A plain object holding what protocol 2 writes through allowlisted calls."""

    def __init__(self):
        self.blob = bytes(range(256)) * 4096  # 1 MiB: _codecs.encode(text, "latin1")
        self.tags = set(range(50_000))  # set([...]) by REDUCE
        self.counts = Counter("abracadabra" * 1000)
        self.weight = flow.arange(12.0).reshape(3, 4)
        self.same = [self.weight, self.weight]


def test_legitimate_whole_objects_with_large_values_still_load():
    buf = io.BytesIO()
    flow.save(Holder(), buf)  # protocol 2, as torch's default
    with flow.serialization.safe_globals([Holder]):
        got = flow.load(io.BytesIO(buf.getvalue()))
    want = Holder()
    assert got.blob == want.blob and got.tags == want.tags and got.counts == want.counts
    np.testing.assert_array_equal(got.weight.numpy(), want.weight.numpy())
    assert got.same[0] is got.same[1] is got.weight


def test_the_two_gib_bytearray_from_a_tiny_file(tmp_path):
    """The report's case, in a child process with its address space capped (so that a
    regression fails the test, not the machine): bytearray(2**31) from a file of about 200
    bytes is refused, and the child's peak RSS stays near its baseline."""
    stream = (P2 + _global("builtins", "bytearray") + _long1(1 << 31) + pickle.TUPLE1
              + pickle.REDUCE + pickle.STOP)
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(_container(stream))
    assert os.path.getsize(path) < 300
    child = textwrap.dedent(f"""
        import pickle, resource
        import sbpflow as flow
        # cap the address space at what is mapped now plus 512 MiB, so that a regression
        # fails this test (MemoryError) instead of taking 2 GiB from the machine
        with open("/proc/self/status") as f:
            vm = next(int(x.split()[1]) for x in f if x.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), vm + (512 << 20)))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            flow.load({str(path)!r})
        except pickle.UnpicklingError as e:
            print("refused:", str(e).splitlines()[-1])
        else:
            print("loaded")
        print("grew_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=240)  # a quiet run takes a few seconds
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("refused:") and "may build in a weights-only load" in lines[0], \
        out.stdout
    assert int(lines[1].split()[1]) < 64 * 1024, out.stdout  # KiB
