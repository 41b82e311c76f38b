"""JSON forms of op attrs, shared by the Job IR and the Plan (which must not import each other).

Tuples, dicts with non-string keys, dtypes, arrays and non-finite floats are tagged so they come
back with their type: `decode(json.loads(json.dumps(encode(v))))` equals v.
"""

from __future__ import annotations

import base64

import numpy as np

from . import dtype as dt


def attr_text(v) -> str:
    """A short readable form of an attr value (arrays by dtype and shape only)."""
    if isinstance(v, np.ndarray):
        return f"array({v.dtype}{list(v.shape)})"
    if isinstance(v, dt.DType):
        return v.name
    return repr(v)


def encode(v, what: str = "attr"):
    """Attr value -> JSON-ready value."""
    if isinstance(v, dt.DType):
        return {"$dtype": v.name}
    if isinstance(v, np.ndarray):
        return {"$array": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode(),
                "dtype": v.dtype.str, "shape": list(v.shape)}
    if isinstance(v, tuple):
        return {"$tuple": [encode(x, what) for x in v]}
    if isinstance(v, list):
        return [encode(x, what) for x in v]
    if isinstance(v, dict):
        return {"$dict": [[encode(k, what), encode(x, what)] for k, x in v.items()]}
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return {"$float": repr(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"{what} of type {type(v).__name__} is not serialisable: {v!r}")


def decode(v):
    """The inverse of `encode`."""
    if isinstance(v, dict):
        if "$dtype" in v:
            return dt._by_name(v["$dtype"])
        if "$array" in v:
            raw = base64.b64decode(v["$array"])
            return np.frombuffer(raw, dtype=np.dtype(v["dtype"])).reshape(v["shape"]).copy()
        if "$tuple" in v:
            return tuple(decode(x) for x in v["$tuple"])
        if "$dict" in v:
            return {decode(k): decode(x) for k, x in v["$dict"]}
        if "$float" in v:
            return float(v["$float"])
        return {k: decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v
