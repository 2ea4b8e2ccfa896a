"""Run by the oracle venv's Python (tests/engine/models/test_gguf_families.py): llama.cpp's logits at
every position of a sequence of token ids, and its greedy continuation, through llama-cpp-python.

    python llama_cpp_logits.py MODEL.gguf '[ids]' N [ADAPTER.gguf]

prints one JSON object: {"logits": [[...] per position], "ids": [the N greedy tokens after the ids]}
(the ids are evaluated as they are, so tokenization plays no part).
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

model, ids, count = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
kwargs = {"lora_path": sys.argv[4]} if len(sys.argv) > 4 else {}
llm = Llama(model_path=model, n_ctx=64, n_threads=1, n_batch=64, verbose=False, seed=0, logits_all=True,
            type_k=0, type_v=0, **kwargs)  # an F32 key/value cache (GGML_TYPE_F32), not the default F16
llm.eval(ids)
logits = [llm.scores[i].tolist() for i in range(len(ids))]
out = []
for _ in range(count):
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out.append(tok)
    llm.eval([tok])
print(json.dumps({"logits": logits, "ids": out}))
