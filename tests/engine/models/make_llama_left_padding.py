"""Write tests/engine/models/fixtures/llama_left_padding.npz: transformers' logits of the committed
tests/fixtures/hf/llama-gqa folder on a left-padded batch, for test_llama.py.

Run by hand only, from the repository root, with the oracle venv (torch and transformers are not
Ember dependencies):

    /tmp/torchvenv/bin/python tests/engine/models/make_llama_left_padding.py

`eager` is transformers' eager attention, `sdpa` its default (torch's scaled_dot_product_attention).
They agree on every real token and differ at the padded queries of row 0 (positions 0 and 1, which
see no real key): eager adds the dtype's minimum to every masked score, so such a row attends
uniformly to all keys, while sdpa's mask handling gives another answer. Positions are 0..6 in
both rows (transformers 5 does not derive position ids from the mask).
"""
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama-gqa"
OUT = Path(__file__).parent / "fixtures" / "llama_left_padding.npz"


def main():
    import torch
    import transformers

    ids = np.array([[0, 0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 8, 9]], dtype=np.int64)
    mask = np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], dtype=np.int64)
    out = {"input_ids": ids, "attention_mask": mask}
    for impl in ("eager", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32,
                                                                  attn_implementation=impl).eval()
        with torch.no_grad():
            out[impl] = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT}; eager vs sdpa per position of row 0:", np.abs(out["eager"] - out["sdpa"])[0].max(-1))


if __name__ == "__main__":
    main()
