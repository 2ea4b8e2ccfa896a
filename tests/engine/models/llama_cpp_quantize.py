"""Run by the oracle venv's Python (tests/engine/models/test_gguf_kquants.py): llama.cpp's own quantizer
(`llama_model_quantize`, through llama-cpp-python) on a GGUF file, one thread.

    python llama_cpp_quantize.py IN.gguf OUT.gguf FTYPE        # FTYPE: Q4_K_M, Q5_K_M, Q6_K, ...

prints one JSON object: {"seconds": the quantizer's wall time}.
"""
import json
import sys
import time

import llama_cpp

source, target, ftype = sys.argv[1], sys.argv[2], sys.argv[3]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
params.nthread = 1
start = time.perf_counter()
rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
if rc != 0:
    sys.exit(f"llama_model_quantize returned {rc}")
print(json.dumps({"seconds": time.perf_counter() - start}))
