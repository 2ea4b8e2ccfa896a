"""A user's own data from a `.npz` or `.csv` file, with errors that say where a file is wrong.

- `load_npz(path, inputs="x", targets="y")`: two arrays of the archive with the same first axis;
  each member's .npy header is checked against the bytes the member holds before anything is
  allocated (a 1 KB file declaring 2**40 floats is an error, not a MemoryError). Integer
  inputs stay integer (int64, token ids); a run casts them to float32 only when its model's
  first layer takes floats (`run_spec.fit_file_data`).
- `load_csv(path, target="last", header=None, delimiter=",")`: one row per item, numeric
  cells; the target column is the last one unless named (by header name or 0-based index).
  A header line is detected when its cells are not numbers (or forced with `header=True/False`).
  `kind="auto"`: targets that are all non-negative integers become class indices (int64),
  others stay float (one column); `kind="classification"` / `"regression"` force either.
  Inputs whose cells are all written as whole numbers (`12`, not `12.0`) stay integer (int64,
  token ids), as in a `.npz`; others are float32.

Every problem raises `DataFileError` naming the file, the line and column where it applies,
what was expected and what was found.
"""
from __future__ import annotations

import csv
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..store.filesource import numpy_shape_problem
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


_NPY_MAGIC = b"\x93NUMPY"
# deflate expands at most 1032:1; a member that claims more than this cannot hold its data
_DEFLATE_RATIO = 1032


def load_npz(path, inputs: str = "x", targets: str = "y") -> InMemoryDataset:
    """The arrays `inputs` and `targets` of a `.npz` archive (np.savez / np.savez_compressed).

    The archive is read member by member here, not by `np.load`: each member's .npy header
    (version, dtype, shape) is checked first (numbers only, never pickled objects; a shape
    NumPy can hold; a byte count that the member really holds), and only then is the array
    allocated and filled. A broken, truncated or lying file is a DataFileError that names the
    array, what its header declares and what the archive holds."""
    p = Path(path)
    if not p.is_file():
        raise DataFileError(p, "file not found")
    try:
        archive = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        try:
            with open(p, "rb") as f:
                single = f.read(len(_NPY_MAGIC)) == _NPY_MAGIC
        except OSError:
            single = False
        if single:
            raise DataFileError(p, "expected a .npz archive of named arrays, found a single .npy array") from None
        raise DataFileError(p, f"expected a NumPy .npz archive, could not read it ({e})") from None
    with archive:
        members = {}
        for info in archive.infolist():
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            members.setdefault(key, info)
        keys = list(members)
        for want in (inputs, targets):
            if want not in keys:
                raise DataFileError(p, f"expected an array named {want!r}, found arrays {keys}")
        archive_size = p.stat().st_size
        x = _read_npz_member(p, archive, members[inputs], inputs, archive_size)
        y = _read_npz_member(p, archive, members[targets], targets, archive_size)
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
    # integer inputs stay integer (int64): token ids for a model that starts with an Embedding.
    # The run casts them to float32 when the model's first layer wants floats (run_spec.fit_file_data).
    if x.dtype.kind in "iu":
        x = x.astype(np.int64)
    elif x.dtype.kind == "b":
        x = x.astype(np.float32)
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        bad = np.argwhere(~np.isfinite(x))[0]
        raise DataFileError(p, f"array {inputs!r}: expected finite numbers, found {x[tuple(bad)]} at index {bad.tolist()}")
    return InMemoryDataset(x, y, p.name)


def _read_npz_member(p: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                     archive_size: int) -> np.ndarray:
    """One array of an archive, its header checked against the member before allocating."""
    what = f"array {name!r}"
    if info.compress_type == zipfile.ZIP_STORED and info.file_size > archive_size:
        raise DataFileError(p, f"{what}: truncated: the archive lists {info.file_size} bytes for it, "
                               f"the whole file has {archive_size}")
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > _DEFLATE_RATIO * info.compress_size + 1024:
        raise DataFileError(p, f"{what}: the archive lists {info.file_size} bytes for it, more than "
                               f"{info.compress_size} compressed bytes can hold")
    try:
        with archive.open(info) as f:
            try:
                version = np.lib.format.read_magic(f)
            except ValueError as e:
                raise DataFileError(p, f"{what}: expected a .npy array in the archive, found other data ({e})") from None
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise DataFileError(p, f"{what}: expected .npy format version 1.0 or 2.0, found "
                                       f"{version[0]}.{version[1]}")
            if dtype.hasobject:
                raise DataFileError(p, f"{what}: expected numbers, found dtype {dtype} (Python objects, "
                                       f"which cannot be read without pickle)")
            if dtype.kind not in "fiub":
                raise DataFileError(p, f"{what}: expected numbers, found dtype {dtype}")
            shape = tuple(int(d) for d in shape)
            if any(d < 0 for d in shape):
                raise DataFileError(p, f"{what}: expected a shape of non-negative sizes, found {list(shape)}")
            problem = numpy_shape_problem(shape, dtype.itemsize)
            if problem is not None:
                shown = list(shape) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ...]"
                raise DataFileError(p, f"{what}: expected a shape NumPy can hold, found {shown} ({problem})")
            count = math.prod(shape)
            declared = count * dtype.itemsize
            holds = info.file_size - f.tell()
            if declared != holds:
                kind = "truncated: " if declared > holds else ""
                raise DataFileError(
                    p, f"{what}: {kind}its header declares shape {list(shape)} of {dtype}, {declared} bytes, "
                       f"the archive member holds {holds} bytes after its header")
            try:
                flat = np.empty(count, dtype=dtype)
            except MemoryError:
                raise DataFileError(p, f"{what}: its header declares {declared} bytes, more than this machine "
                                       f"can allocate") from None
            view = memoryview(flat.view(np.uint8)) if declared else memoryview(b"")
            done = 0
            try:
                while done < declared:
                    chunk = f.read(min(declared - done, 1 << 24))
                    if not chunk:
                        break
                    view[done:done + len(chunk)] = chunk
                    done += len(chunk)
            except EOFError:  # the archive ends inside the member
                pass
            if done < declared:
                raise DataFileError(p, f"{what}: truncated: its header declares {declared} bytes, "
                                       f"the archive member holds {done}")
    except DataFileError:
        raise
    except (ValueError, TypeError, SyntaxError, RecursionError, EOFError, OSError,
            zipfile.BadZipFile, zlib.error, NotImplementedError) as e:
        raise DataFileError(p, f"{what}: the archive member cannot be read ({type(e).__name__}: {e})") from None
    if fortran:
        return flat.reshape(shape[::-1]).transpose()
    return flat.reshape(shape)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _is_whole(cell: str, value: float) -> bool:
    """A cell written as a whole number that float64 holds exactly (`7`, `-3`; not `7.0` or `1e3`)."""
    digits = cell[1:] if cell[:1] in "+-" else cell
    return digits.isdigit() and digits.isascii() and abs(value) <= 2 ** 53


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
    whole_inputs = True  # every input cell written as a whole number: the inputs stay int64
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
            if whole_inputs and c != tcol and not _is_whole(cell, v):
                whole_inputs = False

    if kind not in ("auto", "classification", "regression"):
        raise ValueError(f"load_csv: kind must be 'auto', 'classification' or 'regression', got {kind!r}")
    y = values[:, tcol]
    # integer inputs stay integer (token ids for a model that starts with an Embedding); the run
    # casts them to float32 when the model's first layer takes floats (run_spec.fit_file_data)
    x = np.delete(values, tcol, axis=1).astype(np.int64 if whole_inputs else np.float32)
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
