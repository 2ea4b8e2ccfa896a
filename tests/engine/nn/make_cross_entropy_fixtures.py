"""Write tests/engine/nn/fixtures/cross_entropy_torch.json: PyTorch's cross entropy on seeded
random cases, for `test_cross_entropy_torch.py` to compare `nn.CrossEntropyLoss` against.

Run by hand only, from the repository root, with a Python that has PyTorch (PyTorch is not a
dependency of Ember and must not be installed into the project's venv):

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    PYTHONPATH=. /tmp/torchvenv/bin/python tests/engine/nn/make_cross_entropy_fixtures.py

Each case holds the inputs (float64 logits, or probabilities for `logits=False`; integer
targets; the config: pad tokens, class weights, label smoothing), PyTorch's loss and its
gradient with respect to the input, all in float64. The reference is

- `logits=True`: `F.cross_entropy(x, t, weight=w, ignore_index=pad, label_smoothing=a)`;
- `logits=False`: `F.nll_loss(torch.log(p), t, weight=w, ignore_index=pad)` without
  smoothing; with smoothing `a`, PyTorch's label-smoothing formula (`_smoothed_nll`, checked
  against `F.cross_entropy` on every logits case) applied to `log(p)`. Not
  `F.cross_entropy(torch.log(p), ...)`: its log_softmax renormalises the row, which leaves
  the loss of a row summing to 1 alone but adds `1 / sum(p)` to every entry's gradient.

PyTorch takes a single `ignore_index`; several pad tokens are given to it by mapping every
target that is a pad token to -100 first. Weights and smoothing values are rounded to float32
here, because Ember keeps them in float32 as Burn does: both sides then use the same numbers.
A case where every row is a pad is left out (PyTorch gives nan, Ember 0 by choice; the unit
tests cover it).

The test module imports `torch_reference` from here for its optional live check, so this file
imports torch only inside functions.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cross_entropy_torch.json"
SEED = 20260416


def _smoothed_nll(lp, t, w, a):
    """PyTorch's label-smoothing formula (aten's cross_entropy_loss_label_smoothing, mean
    reduction) on log-probabilities `lp`, ignore index -100: `(1 - a) nll + a / C * smooth`
    with `smooth` the (weighted) sum of `-lp` over the classes of the kept rows, divided by
    the kept rows' count (or their targets' weights)."""
    import torch
    import torch.nn.functional as F

    keep = t != -100
    nll = F.nll_loss(lp, t, weight=w, ignore_index=-100)
    per_row = -(lp if w is None else lp * w[None, :]).sum(1)
    smooth = torch.where(keep, per_row, torch.zeros_like(per_row)).sum()
    denom = keep.sum() if w is None else w[t[keep]].sum()
    return (1 - a) * nll + smooth / denom * (a / lp.shape[1])


def torch_reference(case):
    """PyTorch's loss and gradient with respect to the input for one case (see the module doc)."""
    import torch
    import torch.nn.functional as F

    x = torch.tensor(np.asarray(case["input"], dtype=np.float64), dtype=torch.float64, requires_grad=True)
    t = torch.tensor(np.asarray(case["targets"], dtype=np.int64))
    pads = case["pad_tokens"] or []
    if pads:
        t = torch.where(torch.isin(t, torch.tensor(pads)), torch.tensor(-100), t)
    w = None if case["weights"] is None else torch.tensor(case["weights"], dtype=torch.float64)
    a = 0.0 if case["smoothing"] is None else case["smoothing"]
    if case["logits"]:
        loss = F.cross_entropy(x, t, weight=w, ignore_index=-100, label_smoothing=a)
        # the formula used for probabilities below is PyTorch's own: check it on log_softmax
        mine = _smoothed_nll(F.log_softmax(x, 1), t, w, a)
        assert torch.allclose(loss, mine, rtol=1e-12, atol=1e-14), (case["name"], loss, mine)
    elif a == 0.0:
        loss = F.nll_loss(torch.log(x), t, weight=w, ignore_index=-100)
    else:
        loss = _smoothed_nll(torch.log(x), t, w, a)
    (grad,) = torch.autograd.grad(loss, x)
    return float(loss.detach()), grad.numpy().tolist()


def _f32(v):
    return float(np.float32(v))


def _cases(rng):
    """Seeded configurations: (name, batch, classes, logits, pads, weights, smoothing, pad_rows)."""
    spec = []
    shapes = [(1, 2), (3, 5), (4, 3), (7, 4), (12, 8), (16, 10)]
    smoothings = [0.1, 0.35, 1.0]
    for logits in (True, False):
        kind = "logits" if logits else "probs"
        for b, c in shapes:
            spec.append((f"{kind}-plain-{b}x{c}", b, c, logits, None, False, None, "none"))
        for b, c in [(4, 3), (7, 5), (12, 8)]:
            spec.append((f"{kind}-pad-{b}x{c}", b, c, logits, [c - 1], False, None, "some"))
            spec.append((f"{kind}-pads-{b}x{c}", b, c, logits, [0, c - 1, -100], False, None, "some"))
            spec.append((f"{kind}-weights-{b}x{c}", b, c, logits, None, True, None, "none"))
            spec.append((f"{kind}-pad-weights-{b}x{c}", b, c, logits, [1], True, None, "some"))
        for s in smoothings:
            spec.append((f"{kind}-smooth{s}-7x5", 7, 5, logits, None, False, s, "none"))
            spec.append((f"{kind}-smooth{s}-weights-7x5", 7, 5, logits, None, True, s, "none"))
            spec.append((f"{kind}-smooth{s}-pads-weights-9x4", 9, 4, logits, [0, 3], True, s, "some"))
        spec.append((f"{kind}-smooth0.1-pad-6x3", 6, 3, logits, [2], False, 0.1, "some"))
        spec.append((f"{kind}-all-but-one-padded-6x4", 6, 4, logits, [2], False, None, "all-but-one"))
        spec.append((f"{kind}-all-but-one-padded-weights-6x4", 6, 4, logits, [2], True, None, "all-but-one"))
        spec.append((f"{kind}-all-but-one-padded-smooth-weights-5x4", 5, 4, logits, [1, 3], True, 0.2,
                     "all-but-one"))
        spec.append((f"{kind}-pad-not-a-target-5x4", 5, 4, logits, [3], True, 0.1, "none-of-pads"))
    for name, b, c, logits, pads, weighted, smoothing, pad_rows in spec:
        if logits:
            x = rng.standard_normal((b, c)) * 2.0
        else:
            x = rng.gamma(1.0, size=(b, c)) + 0.05  # strictly positive probabilities
            x /= x.sum(1, keepdims=True)
        targets = rng.integers(0, c, size=b)
        real = [k for k in range(c) if not pads or k not in pads]
        if pad_rows == "none" or pad_rows == "none-of-pads":
            targets = rng.choice(real, size=b) if pads else targets
        elif pad_rows == "all-but-one":
            targets = rng.choice(pads, size=b)
            targets[rng.integers(b)] = rng.choice(real)
        else:  # some rows padded, at least one kept and one padded
            targets[0] = rng.choice(pads)
            targets[-1] = rng.choice(real)
        weights = [_f32(v) for v in rng.uniform(0.2, 3.0, size=c)] if weighted else None
        yield {
            "name": name,
            "logits": logits,
            "pad_tokens": pads,
            "weights": weights,
            "smoothing": None if smoothing is None else _f32(smoothing),
            "input": x.tolist(),
            "targets": [int(v) for v in targets],
        }


def main() -> int:
    import torch

    rng = np.random.default_rng(SEED)
    cases = []
    for case in _cases(rng):
        case["loss"], case["grad"] = torch_reference(case)
        cases.append(case)
    FIXTURE.parent.mkdir(exist_ok=True)
    doc = {
        "about": "PyTorch's cross entropy on seeded random cases; written by "
                 "tests/engine/nn/make_cross_entropy_fixtures.py (run by hand, see its docstring)",
        "torch": torch.__version__,
        "seed": SEED,
        "cases": cases,
    }
    # one case a line: small, and a regenerated fixture diffs case by case
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"})[:-1]
    lines = ",\n".join(json.dumps(c, separators=(",", ":")) for c in cases)
    FIXTURE.write_text(f'{head}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {len(cases)} cases to {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
