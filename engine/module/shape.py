"""Shape contracts: Burn's `assert_shape!` and `debug_assert_shape!` as functions.

    batch_size, seq_length, _ = x.dims()
    assert_shape(x, [batch_size, seq_length, 256])
    assert_shape(hidden, [None, None, self.d_model])   # None skips an axis (Burn's `_`)
    assert_shape(hidden, [..., self.d_model])           # ... stands for any number of axes

A failed check raises `ShapeError` (an `AssertionError`) whose message starts with the call as
written in the source, e.g.

    assert_shape(output, [batch_size, seq_length, self.d_model]): axis 2 expected 512, got 2048 (dims [8, 128, 2048])

The source text is looked up only when a check fails (and cached per code location), so the
passing path is a few integer comparisons. A call spread over several lines is shown on one
line. Where no source exists (a REPL, `exec`), the evaluated pattern is shown instead.

The checked value must be an engine `Tensor`. Anything else (a NumPy array, a list, a `Param`)
raises a `TypeError` naming the call and the type found, e.g.

    assert_shape(input, [..., d_input]): expected an engine Tensor, got numpy.ndarray (convert with Tensor.from_data(...))

so that a layer given the wrong kind of value says so at its boundary, not inside a kernel.

`debug_assert_shape` is the same check, skipped when Python runs with `-O` or after
`set_debug_assertions(False)`.
"""
from __future__ import annotations

import ast
import linecache
import numbers
import sys

from ..tensor import Tensor

__all__ = ["ShapeError", "assert_shape", "debug_assert_shape", "set_debug_assertions", "debug_assertions_enabled"]


class ShapeError(AssertionError):
    """A tensor's dims broke a shape contract; the message names the call, axis and sizes."""


_debug_enabled = True


def set_debug_assertions(enabled: bool) -> None:
    """Turn `debug_assert_shape` checks on or off (they are always off under `python -O`)."""
    global _debug_enabled
    _debug_enabled = bool(enabled)


def debug_assertions_enabled() -> bool:
    return __debug__ and _debug_enabled


def assert_shape(tensor, pattern) -> None:
    """Check `tensor`'s dims against `pattern` (ints, None to skip an axis, `...` once for any
    number of axes); raise `ShapeError` on a mismatch, `TypeError` when `tensor` is not a Tensor."""
    if type(tensor) is not Tensor and not isinstance(tensor, Tensor):
        raise _not_a_tensor(sys._getframe(1), "assert_shape", tensor, pattern)
    dims = tensor.shape
    problem = _check(dims, pattern)
    if problem is not None:
        raise ShapeError(f"{_call_text(sys._getframe(1), 'assert_shape', pattern)}: {problem} (dims {_list(dims)})")


def debug_assert_shape(tensor, pattern) -> None:
    """`assert_shape`, skipped under `python -O` and after `set_debug_assertions(False)`."""
    if __debug__:
        if _debug_enabled:
            if type(tensor) is not Tensor and not isinstance(tensor, Tensor):
                raise _not_a_tensor(sys._getframe(1), "debug_assert_shape", tensor, pattern)
            dims = tensor.shape
            problem = _check(dims, pattern)
            if problem is not None:
                text = _call_text(sys._getframe(1), "debug_assert_shape", pattern)
                raise ShapeError(f"{text}: {problem} (dims {_list(dims)})")


def _not_a_tensor(frame, name: str, value, pattern) -> TypeError:
    """The error for a checked value that is not an engine Tensor, with a hint how to get one."""
    cls = type(value)
    found = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    if cls.__name__ == "Param" and hasattr(value, "val"):
        hint = "read the parameter's tensor with .val()"
    else:
        hint = "convert with Tensor.from_data(...)"
    if not isinstance(pattern, (list, tuple)):
        text = f"{name}(<tensor>, {pattern!r})"
    else:
        text = _call_text(frame, name, pattern)
    return TypeError(f"{text}: expected an engine Tensor, got {found} ({hint})")


def _list(items) -> str:
    return "[" + ", ".join(str(int(i)) for i in items) + "]"


def _slot_error(slot) -> TypeError:
    return TypeError(
        f"assert_shape: a pattern slot must be an int, None (skip the axis) or ... (any axes), got {slot!r}"
    )


def _check(dims: tuple, pattern) -> str | None:
    """None when `dims` fit `pattern`, else what is wrong (without the dims)."""
    if not isinstance(pattern, (list, tuple)):
        raise TypeError(f"assert_shape: the pattern must be a list such as [batch_size, None, 256], got {pattern!r}")
    rank = len(dims)
    n = len(pattern)
    ell = -1
    for i in range(n):
        if pattern[i] is Ellipsis:
            if ell >= 0:
                raise TypeError("assert_shape: '...' may appear at most once in a pattern")
            ell = i
    if ell < 0:
        if rank != n:
            return f"rank {n} expected, got {rank}"
        for i in range(n):
            e = pattern[i]
            if e is None:
                continue
            if type(e) is not int and not _is_int(e):
                raise _slot_error(e)
            if dims[i] != e:
                return f"axis {i} expected {int(e)}, got {dims[i]}"
        return None
    before = ell
    after = n - 1 - ell
    if rank < before + after:
        return f"rank at least {before + after} expected, got {rank}"
    for i in range(before):
        e = pattern[i]
        if e is None:
            continue
        if type(e) is not int and not _is_int(e):
            raise _slot_error(e)
        if dims[i] != e:
            return f"axis {i} expected {int(e)}, got {dims[i]}"
    for j in range(after):
        e = pattern[ell + 1 + j]
        axis = rank - after + j
        if e is None:
            continue
        if type(e) is not int and not _is_int(e):
            raise _slot_error(e)
        if dims[axis] != e:
            return f"axis {axis} expected {int(e)}, got {dims[axis]}"
    return None


def _is_int(e) -> bool:
    return isinstance(e, numbers.Integral) and not isinstance(e, bool)


# (code object, instruction offset) -> the call's text, or None when there is no source
_SOURCE_CACHE: dict[tuple, str | None] = {}


def _call_text(frame, name: str, pattern) -> str:
    key = (frame.f_code, frame.f_lasti)
    try:
        text = _SOURCE_CACHE[key]
    except KeyError:
        text = _SOURCE_CACHE[key] = _source_of_call(frame)
    if text is None:
        return f"{name}(<tensor>, {_pattern_text(pattern)})"
    return text


def _source_of_call(frame) -> str | None:
    try:
        code = frame.f_code
        positions = list(code.co_positions())
        idx = frame.f_lasti // 2
        if not 0 <= idx < len(positions):
            return None
        lineno, end_lineno, col, end_col = positions[idx]
        if None in (lineno, end_lineno, col, end_col):
            return None
        lines = [linecache.getline(code.co_filename, ln, frame.f_globals) for ln in range(lineno, end_lineno + 1)]
        if not all(lines):
            return None
        raw = [ln.encode("utf-8") for ln in lines]  # offsets are in UTF-8 bytes
        if lineno == end_lineno:
            segment = raw[0][col:end_col].decode("utf-8")
        else:
            segment = b"".join([raw[0][col:]] + raw[1:-1] + [raw[-1][:end_col]]).decode("utf-8")
        if "\n" in segment:
            try:
                segment = ast.unparse(ast.parse(segment, mode="eval").body)
            except SyntaxError:
                segment = " ".join(segment.split())
        return segment
    except Exception:  # never let the message lookup hide the shape error
        return None


def _pattern_text(pattern) -> str:
    parts = []
    for e in pattern:
        parts.append("..." if e is Ellipsis else ("None" if e is None else str(e)))
    return "[" + ", ".join(parts) + "]"
