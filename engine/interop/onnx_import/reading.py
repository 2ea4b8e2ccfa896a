"""Reading an ONNX file: its bytes, opset, checks and tensors (inline or external), and onnx's shape inference."""
from __future__ import annotations

import faulthandler
import math
import os
import select
import signal
import time
from pathlib import Path

import numpy as np

from .common import DTYPES, MAX_ELEMENTS, MAX_FILE_BYTES, MIN_OPSET, OnnxImportError, max_opset


MAX_OPSET = None  # set on first import (the installed onnx's newest opset)


def shown(path: Path) -> str:
    s = str(path)
    return s if len(s) <= 200 else s[:100] + "…" + s[-60:]


def read_model(path: Path):
    import onnx  # noqa: PLC0415
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    where = shown(path)
    try:
        if not path.is_file():
            raise OnnxImportError(f"{where}: no such ONNX file" if not path.exists()
                                  else f"{where}: not an ONNX file (expected a regular file)")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise OnnxImportError(f"{where}: not an ONNX file this importer reads (expected at most 2 GiB of "
                                  f"protobuf, found {size / (1 << 30):.1f} GiB)")
        data = path.read_bytes()
    except OSError as e:
        raise OnnxImportError(f"{where}: cannot read it: {e.strerror or e}") from None
    if not data:
        raise OnnxImportError(f"{where}: not an ONNX model (the file is empty)")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, TypeError, RuntimeError, UnicodeDecodeError) as e:
        raise OnnxImportError(f"{where}: not an ONNX model (expected an ONNX ModelProto; the protobuf does not "
                              f"parse: {str(e)[:200] or type(e).__name__})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxImportError(f"{where}: not an ONNX model (expected a ModelProto with a graph, found none)")
    return model, data


def check_opset(model, where: str) -> int:
    global MAX_OPSET
    if MAX_OPSET is None:
        MAX_OPSET = max_opset()
    version = None
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            version = int(imp.version)
    if version is None:
        raise OnnxImportError(f"{where}: the model imports no opset of the default ONNX domain (expected opset "
                              f"{MIN_OPSET} to {MAX_OPSET})")
    if not MIN_OPSET <= version <= MAX_OPSET:
        hint = (" (re-export it with a newer opset, e.g. torch.onnx.export(..., opset_version=17))"
                if version < MIN_OPSET else " (update the onnx package to read it)")
        raise OnnxImportError(f"{where}: opset {version} is outside the range this importer reads (expected "
                              f"{MIN_OPSET} to {MAX_OPSET}){hint}")
    return version


def check_model(model, data: bytes, path: Path, where: str) -> None:
    import onnx  # noqa: PLC0415

    external = any(t.data_location == 1 for t in model.graph.initializer)
    try:
        # with external data the checker needs the file's path: it checks the data lies in the model's folder;
        # else the bytes read (the ModelProto would be serialized again)
        onnx.checker.check_model(str(path) if external else data)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no reason given"
        raise OnnxImportError(f"{where}: the model fails onnx.checker: {first[:300]}") from None
    except UnicodeDecodeError as e:
        raise OnnxImportError(f"{where}: the model fails onnx.checker: a name or text in it is not valid UTF-8 "
                              f"({e.reason} at byte {e.start})") from None


def tensor_array(t, where: str, folder: Path, what: str) -> np.ndarray:
    """The array of a TensorProto, with every size checked before it is trusted."""
    from onnx import numpy_helper  # noqa: PLC0415

    name = t.name or what
    if t.data_type not in DTYPES:
        raise OnnxImportError(f"{where}: tensor {name!r}: data type {t.data_type} is not one the engine holds "
                              f"(expected float, double, float16, an int type or bool)")
    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{where}: tensor {name!r}: negative dims {dims}")
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} make {n:,} elements (at most "
                              f"{MAX_ELEMENTS:,} in one tensor)")
    dtype = np.dtype(DTYPES[t.data_type])
    if t.data_location == 1:  # EXTERNAL
        return external_array(t, where, folder, dims, dtype, name)
    if t.HasField("raw_data"):
        if len(t.raw_data) != n * dtype.itemsize:
            raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} ({dtype.name}) need "
                                  f"{n * dtype.itemsize:,} bytes of data, found {len(t.raw_data):,}")
    else:
        field_of = {np.float32: "float_data", np.float64: "double_data", np.int64: "int64_data",
                    np.uint64: "uint64_data", np.uint32: "uint64_data"}
        fname = field_of.get(dtype.type, "int32_data")
        have = len(getattr(t, fname))
        if have != n:
            raise OnnxImportError(f"{where}: tensor {name!r}: dims {dims} need {n:,} values, found {have:,} "
                                  f"(in {fname})")
    try:
        arr = numpy_helper.to_array(t)
    except (ValueError, TypeError) as e:
        raise OnnxImportError(f"{where}: tensor {name!r}: its data cannot be read: {e}") from None
    return normalize_array(np.asarray(arr).reshape(dims))


def normalize_array(arr: np.ndarray) -> np.ndarray:
    """float -> float32, ints -> int64, bool stays: the dtypes the engine computes with."""
    k = arr.dtype.kind
    if k == "f" and arr.dtype != np.float32:
        return arr.astype(np.float32)
    if k in "iu" and arr.dtype != np.int64:
        return arr.astype(np.int64)
    return arr


def external_array(t, where: str, folder: Path, dims, dtype, name: str) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    n = math.prod(dims)
    need = n * dtype.itemsize
    if not loc or os.path.isabs(loc) or "\x00" in loc:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data location {loc[:80]!r} refused (expected a "
                              f"file name relative to the model's folder)")
    base = folder.resolve()
    target = (base / loc).resolve()
    try:
        target.relative_to(base)
    except ValueError:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data {loc[:80]!r} lies outside the model's "
                              f"folder {base} (refused)") from None
    if not target.is_file():
        raise OnnxImportError(f"{where}: tensor {name!r}: external data file {loc[:80]!r} not found next to the "
                              f"model")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info.get("length", str(need)))
    except ValueError:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data offset / length must be integers, found "
                              f"{info.get('offset')!r} / {info.get('length')!r}") from None
    size = target.stat().st_size
    if offset < 0 or length != need or offset + length > size:
        raise OnnxImportError(f"{where}: tensor {name!r}: external data at offset {offset} of length {length} "
                              f"(expected {need} bytes for dims {dims} {dtype.name}) does not fit {loc!r} "
                              f"({size} bytes)")
    with open(target, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    return normalize_array(np.frombuffer(raw, dtype=dtype).reshape(dims).copy())


# ---------------------------------------------------------------------------------- the import

def light_model(model):
    """The model for shape inference: initializers of more than 4,096 elements become typed graph inputs
    (their dims are all the inference reads; small ones, such as a Reshape's shape, keep their values)."""
    from onnx import ModelProto, helper  # noqa: PLC0415

    graph = model.graph
    if not any(math.prod(t.dims) > 4096 for t in graph.initializer):
        return model
    light = ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    g = light.graph
    g.node.extend(graph.node)
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    declared = {v.name for v in graph.input}
    for t in graph.initializer:
        if math.prod(t.dims) > 4096:
            if t.name not in declared:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            g.initializer.append(t)
    return light


INFERENCE_SECONDS = 120  # onnx's shape inference of a 10k-node graph takes about a second


def infer_shapes(light):
    """onnx's shape inference of `light` (None where it fails). It is C++ that a hostile graph can make abort
    the process (a negative size reaching Slice's std::clamp assertion: onnx built with assertions) or loop,
    so where the system forks it runs in a child process that sends the result back through a pipe: a crash
    or `INFERENCE_SECONDS` without an answer is a failed inference, not a lost process."""
    import onnx  # noqa: PLC0415

    if not hasattr(os, "fork"):
        try:
            return onnx.shape_inference.infer_shapes(light, strict_mode=False)
        except Exception:  # noqa: BLE001 - a hint only
            return None
    data = light.SerializeToString()
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: infer, write, exit without running the parent's cleanups
        code = 1
        try:
            os.close(r)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # an assertion's message is the parent's to give
            faulthandler.disable()  # nor a traceback of the crash (pytest's goes to a copy of stderr)
            out = memoryview(onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data),
                                                               strict_mode=False).SerializeToString())
            while out:
                out = out[os.write(w, out):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, done = [], False
    deadline = time.monotonic() + INFERENCE_SECONDS
    try:
        while not done and time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(r, 1 << 20) if ready else b""
            chunks.append(chunk)
            done = ready and not chunk
    finally:
        os.close(r)
        if not done:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if not done or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        return onnx.ModelProto.FromString(b"".join(chunks))
    except Exception:  # noqa: BLE001 - a hint only
        return None
