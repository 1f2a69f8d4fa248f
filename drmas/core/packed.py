"""Packed arrays on the wire: token ids and per-token floats as little-endian bytes, never element lists.

A sample of 32k tokens carried as msgpack lists cost every hop (producer, buffer, learner) one Python
object per element to decode and re-encode; packed, the same data is one memcpy to encode and a zero-copy
numpy view to decode, so the buffer and the learner's collation stay far below the wire's own cost.

Encoding: a msgpack extension whose code names the element type (`EXT_INT32` token ids, `EXT_FLOAT32`
log-probs) and whose payload is the array's little-endian bytes. Decoding yields read-only `np.frombuffer`
views of the received message (they keep it alive); copy before writing into one.

Python lists are still accepted where samples are *built* (`token_ids`, `float_values` convert them once,
at the producer), but a list arriving on the wire in an array field is refused: that is what a peer of the
previous sample schema sends.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

EXT_INT32 = 1
EXT_FLOAT32 = 2
INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")
_DTYPES = {EXT_INT32: INT32, EXT_FLOAT32: FLOAT32}
_CODES = {INT32: EXT_INT32, FLOAT32: EXT_FLOAT32}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def token_ids(value: Any, field: str) -> np.ndarray:
    """`value` (array or sequence of ints) as a contiguous little-endian int32 array; no copy if it is one.

    Ids outside int32 cannot travel and raise `ValueError`; non-integers raise `TypeError`."""
    return _as_array(value, INT32, "iu", field)


def float_values(value: Any, field: str) -> np.ndarray:
    """`value` (array or sequence of numbers) as a contiguous little-endian float32 array; no copy if it is
    one. Values beyond float32's range become inf, which the finiteness checks then refuse."""
    return _as_array(value, FLOAT32, "iuf", field)


def is_packed(value: Any, dtype: np.dtype) -> bool:
    """Whether `value` already is what travels: a contiguous array of `dtype` (every decoded array is)."""
    # `is`: numpy keeps one dtype object per builtin type, and an equal one that is not it takes the slow path
    return type(value) is np.ndarray and value.dtype is dtype and value.flags.c_contiguous


def _as_array(value: Any, dtype: np.dtype, kinds: str, field: str) -> np.ndarray:
    if is_packed(value, dtype):
        return value  # the decoded and the already converted case: nothing to do
    array = np.asarray(value)
    if array.size == 0:
        return np.zeros(0, dtype=dtype)
    if array.dtype.kind not in kinds:
        raise TypeError(f"{field} must be {'integer token ids' if dtype == INT32 else 'numbers'}, "
                        f"got {array.dtype} values")
    if array.ndim != 1:
        raise ValueError(f"{field} must be one-dimensional, got shape {array.shape}")
    if dtype == INT32 and array.dtype != INT32 and (array.min() < _INT32_MIN or array.max() > _INT32_MAX):
        raise ValueError(f"{field} has token ids outside int32 (min {array.min()}, max {array.max()})")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(array, dtype=dtype)


def enc_hook(obj: Any) -> msgspec.msgpack.Ext:
    """msgspec encoder hook: an int32/float32 array as an extension of its little-endian bytes."""
    if isinstance(obj, np.ndarray):
        code = _CODES.get(obj.dtype)
        if code is None:
            raise TypeError(f"only int32 and float32 arrays travel packed, got {obj.dtype}")
        return msgspec.msgpack.Ext(code, np.ascontiguousarray(obj).data.cast("B"))
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def ext_hook(code: int, data: memoryview) -> np.ndarray:
    """msgspec decoder hook: a read-only array viewing the extension's bytes in the received message."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise ValueError(f"unknown msgpack extension code {code} (known: {sorted(_DTYPES)})")
    try:
        return np.frombuffer(data, dtype)  # positional: numpy parses a `dtype=` keyword at 3x the cost
    except ValueError:
        raise ValueError(f"packed {dtype} array of {len(data)} bytes is not a whole number of elements") from None


def dec_hook(type_: type, obj: Any) -> Any:
    """msgspec decoder hook for array fields: only packed arrays are accepted, never element lists."""
    if type_ is np.ndarray:
        if isinstance(obj, np.ndarray):
            return obj
        raise ValueError(f"expected a packed array (msgpack extension), got {type(obj).__name__}: "
                         "the sender uses an older sample schema")
    raise NotImplementedError(f"cannot decode {type_}")


def encoder() -> msgspec.msgpack.Encoder:
    """A msgpack encoder that packs arrays."""
    return msgspec.msgpack.Encoder(enc_hook=enc_hook)


def decoder(type_: Any) -> msgspec.msgpack.Decoder:
    """A msgpack decoder of `type_` whose array fields decode to zero-copy views."""
    return msgspec.msgpack.Decoder(type_, ext_hook=ext_hook, dec_hook=dec_hook)
