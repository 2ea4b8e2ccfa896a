"""The one error every checkpoint problem ends in: `RecordError`."""
from __future__ import annotations


def _fmt_shape(shape) -> str:
    return "?" if shape is None else "[" + ", ".join(str(int(d)) for d in shape) + "]"


class RecordError(ValueError):
    """A checkpoint could not be read, written or applied to a module.

    For a failed load into a module the error lists every problem at once:
    `missing` (path, expected shape), `unused` (path, found shape) and `mismatched`
    (path, expected shape, found shape); the message says the same in words.
    `where` names the file (or "bytes") a format error was found in.
    """

    def __init__(self, message: str, *, where: str | None = None,
                 missing=(), unused=(), mismatched=()):
        self.where = where
        self.missing = list(missing)
        self.unused = list(unused)
        self.mismatched = list(mismatched)
        self.reason = message
        super().__init__(f"{where}: {message}" if where else message)

    @classmethod
    def for_load(cls, module_name: str, missing, unused, mismatched, extra=()) -> "RecordError":
        lines = [f"the record does not fit {module_name}:"]
        for path, expected in missing:
            lines.append(f"  missing   {path}: expected shape {_fmt_shape(expected)}, not in the record")
        for path, found in unused:
            lines.append(f"  unused    {path}: found shape {_fmt_shape(found)}, no parameter of the module has this path")
        for path, expected, found in mismatched:
            lines.append(f"  mismatch  {path}: expected shape {_fmt_shape(expected)}, found {_fmt_shape(found)}")
        lines.extend(f"  {line}" for line in extra)
        hints = []
        if missing:
            hints.append("record.allow_partial(True) keeps missing parameters as they are")
        if unused:
            hints.append("record.allow_unused(True) ignores tensors the module has no place for")
        if hints:
            lines.append("  (" + "; ".join(hints) + ")")
        return cls("\n".join(lines), missing=missing, unused=unused, mismatched=mismatched)
