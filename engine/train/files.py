"""A user's own data from a `.npz` or `.csv` file, with errors that say where a file is wrong.

- `load_npz(path, inputs="x", targets="y")`: two arrays of the archive with the same first axis.
- `load_csv(path, target="last", header=None, delimiter=",")`: one row per item, numeric
  cells; the target column is the last one unless named (by header name or 0-based index).
  A header line is detected when its cells are not numbers (or forced with `header=True/False`).
  `kind="auto"`: targets that are all non-negative integers become class indices (int64),
  others stay float (one column); `kind="classification"` / `"regression"` force either.

Every problem raises `DataFileError` naming the file, the line and column where it applies,
what was expected and what was found.
"""
from __future__ import annotations

import csv
import math
import zipfile
from pathlib import Path

import numpy as np

from .data import InMemoryDataset


class DataFileError(ValueError):
    """A data file cannot be used; the message names the file, the place, expected vs found."""

    def __init__(self, path, message: str, line: int | None = None, column: int | None = None):
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line
        self.column = column


def load_data_file(path, **kwargs) -> InMemoryDataset:
    """Load a `.npz` or `.csv` file by its extension."""
    p = Path(path)
    ext = p.suffix.lower()
    if ext == ".npz":
        return load_npz(p, **kwargs)
    if ext in (".csv", ".txt", ".tsv"):
        if ext == ".tsv":
            kwargs.setdefault("delimiter", "\t")
        return load_csv(p, **kwargs)
    raise DataFileError(p, f"expected a .npz or .csv file, found extension {ext or '(none)'!r}")


def load_npz(path, inputs: str = "x", targets: str = "y") -> InMemoryDataset:
    p = Path(path)
    if not p.is_file():
        raise DataFileError(p, "file not found")
    try:
        archive = np.load(p, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise DataFileError(p, f"expected a NumPy .npz archive, could not read it ({e})") from None
    with archive:
        if not hasattr(archive, "files"):
            raise DataFileError(p, "expected a .npz archive of named arrays, found a single .npy array")
        keys = list(archive.files)
        for want in (inputs, targets):
            if want not in keys:
                raise DataFileError(p, f"expected an array named {want!r}, found arrays {keys}")
        try:
            x = archive[inputs]
            y = archive[targets]
        except ValueError as e:  # object arrays need pickle, which is refused
            raise DataFileError(p, f"expected numeric arrays, could not read one without pickle ({e})") from None
    for name, arr in ((inputs, x), (targets, y)):
        if arr.dtype.kind not in "fiub":
            raise DataFileError(p, f"array {name!r}: expected numbers, found dtype {arr.dtype}")
        if arr.ndim == 0:
            raise DataFileError(p, f"array {name!r}: expected at least one axis (one entry per item), found a scalar")
    if x.shape[0] != y.shape[0]:
        raise DataFileError(
            p,
            f"arrays {inputs!r} and {targets!r} must have the same length: expected {x.shape[0]} items "
            f"(as in {inputs!r}, shape {list(x.shape)}), found {y.shape[0]} in {targets!r} (shape {list(y.shape)})",
        )
    if x.dtype.kind in "iub":
        x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        bad = np.argwhere(~np.isfinite(x))[0]
        raise DataFileError(p, f"array {inputs!r}: expected finite numbers, found {x[tuple(bad)]} at index {bad.tolist()}")
    return InMemoryDataset(x, y, p.name)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def load_csv(path, target="last", header: bool | None = None, delimiter: str = ",",
             kind: str = "auto") -> InMemoryDataset:
    p = Path(path)
    if not p.is_file():
        raise DataFileError(p, "file not found")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataFileError(p, f"expected UTF-8 text, found undecodable bytes at offset {e.start}") from None
    rows = []  # (line number, cells)
    for number, cells in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), start=1):
        if not cells or all(not c.strip() for c in cells):
            continue
        rows.append((number, [c.strip() for c in cells]))
    if not rows:
        raise DataFileError(p, "expected rows of numbers, found an empty file")

    first_line, first = rows[0]
    if header is None:
        header = not all(_is_number(c) for c in first)
    names = first if header else [str(i) for i in range(len(first))]
    data_rows = rows[1:] if header else rows
    if not data_rows:
        raise DataFileError(p, "expected at least one data row after the header, found none", line=first_line)
    ncols = len(names)
    if ncols < 2:
        raise DataFileError(p, f"expected at least 2 columns (inputs and a target), found {ncols}", line=first_line)

    if target == "last":
        tcol = ncols - 1
    elif isinstance(target, int):
        if not -ncols <= target < ncols:
            raise DataFileError(p, f"target column {target} is out of range: the file has {ncols} columns")
        tcol = target % ncols
    else:
        if target not in names:
            raise DataFileError(p, f"expected a target column named {target!r}, found columns {names}", line=first_line)
        tcol = names.index(target)

    values = np.empty((len(data_rows), ncols), dtype=np.float64)
    for r, (number, cells) in enumerate(data_rows):
        if len(cells) != ncols:
            source = f"as in the header on line {first_line}" if header else f"as on line {first_line}"
            raise DataFileError(p, f"expected {ncols} columns ({source}), found {len(cells)}", line=number)
        for c, cell in enumerate(cells):
            try:
                v = float(cell)
            except ValueError:
                label = f" ({names[c]!r})" if header else ""
                raise DataFileError(
                    p, f"expected a number{label}, found {cell!r}", line=number, column=c + 1
                ) from None
            if not math.isfinite(v):
                raise DataFileError(p, f"expected a finite number, found {cell!r}", line=number, column=c + 1)
            values[r, c] = v

    if kind not in ("auto", "classification", "regression"):
        raise ValueError(f"load_csv: kind must be 'auto', 'classification' or 'regression', got {kind!r}")
    y = values[:, tcol]
    x = np.delete(values, tcol, axis=1).astype(np.float32)
    labels = np.all(y == np.round(y)) and y.min() >= 0
    if kind == "classification" and not labels:
        bad = int(np.argmax((y != np.round(y)) | (y < 0)))
        raise DataFileError(
            p, f"expected a class label (a non-negative integer), found {data_rows[bad][1][tcol]!r}",
            line=data_rows[bad][0], column=tcol + 1,
        )
    if labels and kind != "regression":
        y = y.astype(np.int64)
    else:
        y = y.astype(np.float32)[:, None]
    return InMemoryDataset(x, y, p.name)
