"""ONNX import and export (issue 21): a ResNet-50-sized graph.

Import rows: a ResNet-50 graph (conv 7x7, 3-4-6-3 bottleneck stages with projection shortcuts,
BatchNormalization after every convolution, global average pool, Gemm 2048 -> 1000; 25.6 M
float32 parameters, about 100 MB) is written with `onnx.helper` into a temporary folder (seeded
random weights; no torch needed), then, each in a fresh process so that nothing is cached:
`import_onnx` (parse, onnx.checker, mapping, shape analysis of the design), `build_model(...)`
plus `load_record` (the weights handed over), and one forward pass of a 1x3x224x224 image, with
the growth of resident memory over each step. Targets (issue 21): none stated for the import;
the rows say what it costs.

    .venv/bin/python benchmarks/onnx_io.py
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import fmt_time, machine_line, print_table  # noqa: E402

ROUNDS = 3



def resnet50_onnx(path: Path, seed: int = 0) -> dict:
    """Write a ResNet-50 graph (opset 17, dynamic batch); returns its parameter and node counts."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = {"params": 0}

    def tensor(name, shape, scale=None):
        n = int(np.prod(shape))
        fan = shape[1] * int(np.prod(shape[2:])) if len(shape) > 1 else 1
        arr = (rng.standard_normal(n, dtype=np.float32) * (scale if scale is not None else (2.0 / fan) ** 0.5))
        inits.append(numpy_helper.from_array(arr.reshape(shape).astype(np.float32), name))
        count["params"] += n
        return name

    def conv_bn(x, name, cin, cout, k, stride, relu=True):
        w = tensor(f"{name}.conv.weight", (cout, cin, k, k))
        p = k // 2
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}.c"], name=f"{name}/Conv", kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[p, p, p, p]))
        scale = tensor(f"{name}.bn.weight", (cout,), 0.1)
        bias = tensor(f"{name}.bn.bias", (cout,), 0.1)
        mean = tensor(f"{name}.bn.running_mean", (cout,), 0.1)
        var = f"{name}.bn.running_var"
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32), var))
        count["params"] += cout
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c", scale, bias, mean, var], [f"{name}.b"],
                                      name=f"{name}/BatchNormalization", epsilon=1e-5))
        if not relu:
            return f"{name}.b"
        nodes.append(helper.make_node("Relu", [f"{name}.b"], [f"{name}.r"], name=f"{name}/Relu"))
        return f"{name}.r"

    x = conv_bn("x", "stem", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="stem/MaxPool", kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 1 else 1
            name = f"layer{stage}.{b}"
            h = conv_bn(x, f"{name}.a", cin, width, 1, 1)
            h = conv_bn(h, f"{name}.b", width, width, 3, stride)
            h = conv_bn(h, f"{name}.c", width, 4 * width, 1, 1, relu=False)
            short = conv_bn(x, f"{name}.down", cin, 4 * width, 1, stride, relu=False) if b == 0 else x
            nodes.append(helper.make_node("Add", [h, short], [f"{name}.sum"], name=f"{name}/Add"))
            nodes.append(helper.make_node("Relu", [f"{name}.sum"], [f"{name}.out"], name=f"{name}/Relu"))
            x, cin = f"{name}.out", 4 * width
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="Flatten", axis=1))
    w = tensor("fc.weight", (1000, 2048))
    bias = tensor("fc.bias", (1000,), 0.01)
    nodes.append(helper.make_node("Gemm", ["flat", w, bias], ["logits"], name="fc/Gemm", transB=1))
    graph = helper.make_graph(nodes, "resnet50", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                ["batch", 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return {"params": count["params"], "nodes": len(nodes), "bytes": path.stat().st_size}


CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
import numpy as np
from engine import Tensor
from engine.design import build_model
from engine.interop import import_onnx
import onnx  # the modules are loaded before the timing
out = {}
r0 = rss(); t0 = time.perf_counter()
imported = import_onnx(sys.argv[2])
t1 = time.perf_counter(); r1 = rss()
model = build_model(imported.design).load_record(imported.record).valid()
t2 = time.perf_counter(); r2 = rss()
x = Tensor.from_data(np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32))
y = model.forward(x)
t3 = time.perf_counter(); r3 = rss()
out = {"import": [t1 - t0, r1 - r0], "build": [t2 - t1, r2 - r1], "forward": [t3 - t2, r3 - r2],
       "nodes": len(list(imported.design.topological_order())), "counts": imported.report.counts(),
       "out": list(y.shape), "finite": bool(np.isfinite(y.numpy()).all())}
print(json.dumps(out))
"""


def import_rows(tmp: Path) -> tuple[list, dict]:
    path = tmp / "resnet50.onnx"
    made = resnet50_onnx(path)
    runs = []
    for _ in range(ROUNDS):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(path)], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"})
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    best = {k: min(r[k][0] for r in runs) for k in ("import", "build", "forward")}
    mem = {k: max(r[k][1] for r in runs) for k in ("import", "build", "forward")}
    rows = [["import_onnx (parse, check, map, analyze)", fmt_time(best["import"]), f"{mem['import']:+.1f} MB"],
            ["build_model + load_record", fmt_time(best["build"]), f"{mem['build']:+.1f} MB"],
            ["first forward, 1x3x224x224", fmt_time(best["forward"]), f"{mem['forward']:+.1f} MB"]]
    return rows, {"made": made, "last": runs[-1]}


def main() -> int:
    print(machine_line())
    tmp = Path(tempfile.mkdtemp(prefix="ember-onnx-bench-"))
    try:
        rows, info = import_rows(tmp)
        made, last = info["made"], info["last"]
        print_table(f"Import a ResNet-50 ONNX graph ({made['params']:,} parameters, {made['nodes']} nodes, "
                    f"{made['bytes'] / 2**20:.1f} MiB; each step in a fresh process, best of {ROUNDS})",
                    ["step", "time", "resident memory"], rows)
        print()
        print(f"- imported as {last['nodes']} design nodes: {last['counts']}; output {last['out']}, finite: "
              f"{last['finite']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
