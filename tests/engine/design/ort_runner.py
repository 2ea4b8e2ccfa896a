"""Runs an ONNX file with onnxruntime for the export tests, in this interpreter or another one
(`python ort_runner.py model.onnx feeds.npz out.npz`).

feeds.npz holds `run<k>/<input name>` arrays: each run k's outputs are written as `run<k>/<output
name>`. With `generate/prompt` (int64 [batch, n]) and `generate/steps`, the cache variant is run step by
step from an empty past, greedily, and the new tokens are written as `generate/tokens`, the logits of
every position fed (the prompt's, then each new token's but the last) as `generate/logits`;
`generate/mask` (int64 [batch, n], 0 at a left-padded row's padding) is the prompt's attention mask
(default all ones), each new token's column 1."""
from __future__ import annotations

import sys

import numpy as np


def _greedy(sess, prompt: np.ndarray, steps: int, mask: np.ndarray | None = None) -> tuple:
    names = [i.name for i in sess.get_inputs()]
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    b = prompt.shape[0]
    feed = {}
    for i in pasts:
        heads, dim = i.shape[1], i.shape[3]
        feed[i.name] = np.zeros((b, heads, 0, dim), dtype=np.float32)
    ids, out, logits = prompt, [], []
    mask = np.ones(prompt.shape, dtype=np.int64) if mask is None else mask.astype(np.int64)
    for _ in range(steps):
        feed["input_ids"] = ids
        feed["attention_mask"] = mask
        results = sess.run(None, {n: feed[n] for n in names})
        outs = dict(zip([o.name for o in sess.get_outputs()], results))
        logits.append(outs["logits"])
        nxt = outs["logits"][:, -1].argmax(-1).astype(np.int64)
        out.append(nxt)
        ids = nxt[:, None]
        mask = np.concatenate([mask, np.ones((b, 1), dtype=np.int64)], axis=1)
        for i in pasts:
            feed[i.name] = outs["present." + i.name[len("past_key_values."):]]
    return np.stack(out, axis=1), np.concatenate(logits, axis=1)


def run(model_path: str, feeds: dict) -> dict:
    import onnxruntime as ort  # noqa: PLC0415

    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    out = {}
    runs = sorted({k.split("/")[0] for k in feeds if k.startswith("run")})
    for r in runs:
        feed = {k.split("/", 1)[1]: v for k, v in feeds.items() if k.startswith(r + "/")}
        for o, v in zip(sess.get_outputs(), sess.run(None, feed)):
            out[f"{r}/{o.name}"] = v
    if "generate/prompt" in feeds:
        steps = int(feeds["generate/steps"])
        out["generate/tokens"], out["generate/logits"] = _greedy(sess, feeds["generate/prompt"], steps,
                                                                 feeds.get("generate/mask"))
    out["inputs"] = np.asarray([f"{i.name}:{i.shape}" for i in sess.get_inputs()])
    out["outputs"] = np.asarray([f"{o.name}:{o.shape}" for o in sess.get_outputs()])
    return out


if __name__ == "__main__":
    feeds = dict(np.load(sys.argv[2]))
    np.savez(sys.argv[3], **run(sys.argv[1], feeds))
