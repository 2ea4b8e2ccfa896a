"""ONNX export by tracing, and the shape-only trace of a lazy 7 B model.

- export of a ResNet-50-sized model (bottleneck blocks 3-4-6-3 of engine.nn Conv2d / BatchNorm /
  Relu, 25.6 M parameters) on one 224x224 image: trace + ONNX graph + checker + atomic write,
  the file's size, the peak Python memory (tracemalloc), and where onnxruntime is installed the
  largest difference of its output from Ember's;
- the shape-only trace of llama-7b (engine.design.trace_model(..., shape_only=True)): time, peak
  memory, and how many parameters it allocated (target: < 2 s, < 100 MB, none).

    .venv/bin/python benchmarks/onnx_export.py
"""
from __future__ import annotations

import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import fmt_time, machine, print_table  # noqa: E402
from engine import Module, Tensor, nn  # noqa: E402
from engine.interop import export_onnx, trace_model  # noqa: E402
from engine.nn.conv import PaddingConfig2d  # noqa: E402
from resources.examples import llama_7b  # noqa: E402


def _conv(c_in, c_out, k, stride=1):
    p = k // 2
    return nn.Conv2dConfig((c_in, c_out), (k, k), stride=(stride, stride),
                           padding=PaddingConfig2d.Explicit(p, p, p, p), bias=False).init()


class Bottleneck(Module):
    def __init__(self, c_in, width, stride):
        c_out = width * 4
        self.conv1, self.bn1 = _conv(c_in, width, 1), nn.BatchNormConfig(width).init()
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNormConfig(width).init()
        self.conv3, self.bn3 = _conv(width, c_out, 1), nn.BatchNormConfig(c_out).init()
        self.relu = nn.Relu()
        self.down = None
        self.down_bn = None
        if stride != 1 or c_in != c_out:
            self.down, self.down_bn = _conv(c_in, c_out, 1, stride), nn.BatchNormConfig(c_out).init()

    def forward(self, x):
        y = self.relu.forward(self.bn1.forward(self.conv1.forward(x)))
        y = self.relu.forward(self.bn2.forward(self.conv2.forward(y)))
        y = self.bn3.forward(self.conv3.forward(y))
        skip = x if self.down is None else self.down_bn.forward(self.down.forward(x))
        return self.relu.forward(y + skip)


class ResNet50(Module):
    def __init__(self, classes=1000):
        self.stem = _conv(3, 64, 7, 2)
        self.stem_bn = nn.BatchNormConfig(64).init()
        self.relu = nn.Relu()
        self.pool = nn.MaxPool2dConfig((3, 3), strides=(2, 2), padding=PaddingConfig2d.Explicit(1, 1, 1, 1)).init()
        blocks, c_in = [], 64
        for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(n):
                blocks.append(Bottleneck(c_in, width, stride if i == 0 else 1))
                c_in = width * 4
        self.blocks = blocks
        self.avg = nn.AdaptiveAvgPool2dConfig((1, 1)).init()
        self.fc = nn.LinearConfig(2048, classes).init()

    def forward(self, x):
        x = self.pool.forward(self.relu.forward(self.stem_bn.forward(self.stem.forward(x))))
        for b in self.blocks:
            x = b.forward(x)
        return self.fc.forward(self.avg.forward(x).flatten(1))


def export_resnet(rows):
    model = ResNet50()
    for _, p in model.named_params():
        p.base()
    n = model.num_params()
    x = Tensor.from_data(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    t0 = time.perf_counter()
    import onnx  # noqa: PLC0415,F401 - imported once per process; timed apart from the export
    t_import = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "resnet50.onnx"
        tracemalloc.start()
        t0 = time.perf_counter()
        export_onnx(model, path, x)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        size = path.stat().st_size
        t0 = time.perf_counter()
        want = model.valid().forward(x).numpy()
        t_fwd = time.perf_counter() - t0
        diff = "onnxruntime not installed"
        try:
            import onnxruntime as ort  # noqa: PLC0415

            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            got = sess.run(None, {"input": x.numpy()})[0]
            diff = f"{float(np.abs(got - want).max()):.1e}"
        except ImportError:
            pass
    rows.append([f"export ResNet-50-sized ({n / 1e6:.1f} M params), 1x3x224x224", fmt_time(elapsed),
                 f"{peak / 1e6:.0f} MB", f"file {size / 1e6:.0f} MB; one Ember forward {fmt_time(t_fwd)}; import onnx {fmt_time(t_import)}; "
                 f"max |onnxruntime - Ember| {diff}"])


def shape_only_7b(rows):
    model = llama_7b.build()
    x = llama_7b.example_input(2)
    tracemalloc.start()
    t0 = time.perf_counter()
    tr = trace_model(model, x, shape_only=True)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    allocated = sum(p.is_initialized() for _, p in model.named_params())
    rows.append([f"shape-only trace llama-7b ({model.num_params() / 1e9:.2f} B params), [2, 8] tokens",
                 fmt_time(elapsed), f"{peak / 1e6:.0f} MB",
                 f"{len(tr.ops)} ops, {len(tr.modules)} module calls; {allocated} parameters allocated"])


def main():
    print(f"machine: {machine()}")
    rows: list = []
    shape_only_7b(rows)
    export_resnet(rows)
    print_table("ONNX export", ["case", "time", "peak memory (tracemalloc)", "notes"], rows)


if __name__ == "__main__":
    main()
