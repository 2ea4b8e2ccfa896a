"""Run by the oracle venv's Python (tests/engine/models/test_gguf_export.py): llama.cpp's greedy
tokens for a GGUF file (and optionally a LoRA adapter), through llama-cpp-python.

    python llama_cpp_oracle.py MODEL.gguf '[prompt ids]' N [ADAPTER.gguf]

prints one JSON object: {"ids": [the N greedy tokens], "logits": [the logits after the prompt]} (argmax of llama.cpp's logits after each
step, the prompt fed as ids, so tokenization plays no part).
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

model, prompt, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
kwargs = {"lora_path": sys.argv[4]} if len(sys.argv) > 4 else {}
llm = Llama(model_path=model, n_ctx=128, n_threads=1, n_batch=64, verbose=False, seed=0, logits_all=True, **kwargs)
llm.eval(prompt)
first = llm.scores[llm.n_tokens - 1].tolist()
out = []
for _ in range(count):
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(tok)
    llm.eval([tok])
print(json.dumps({"ids": out, "logits": first}))
