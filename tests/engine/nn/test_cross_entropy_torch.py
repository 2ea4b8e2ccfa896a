"""`nn.CrossEntropyLoss` against PyTorch: losses and input gradients of committed cases.

The expected values in fixtures/cross_entropy_torch.json were computed once with PyTorch 2.13
by make_cross_entropy_fixtures.py (see its docstring for the exact reference calls); these
tests read them and need no PyTorch. `test_live_torch_agrees` recomputes a few cases with
PyTorch when it is importable, and is skipped otherwise.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from engine import Tensor, nn

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cross_entropy_torch.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _loss(case):
    return nn.CrossEntropyLossConfig(
        pad_tokens=case["pad_tokens"], weights=case["weights"], smoothing=case["smoothing"], logits=case["logits"]
    ).init()


def _ember(case, dtype="float64"):
    x = Tensor.from_data(np.asarray(case["input"]), dtype=dtype).require_grad()
    t = Tensor.from_data(np.asarray(case["targets"], dtype=np.int64))
    out = _loss(case).forward(x, t)
    grad = x.grad(out.backward())
    return out.numpy(), grad.numpy()


def test_the_fixture_covers_what_it_should():
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    for kind in (True, False):
        mine = [c for c in CASES if c["logits"] is kind]
        assert any(c["pad_tokens"] and len(c["pad_tokens"]) > 1 for c in mine)
        assert any(c["weights"] and c["pad_tokens"] and c["smoothing"] for c in mine)
        kept = [sum(t not in (c["pad_tokens"] or []) for t in c["targets"]) for c in mine]
        assert 1 in kept and any(k < len(c["targets"]) for k, c in zip(kept, mine))
        assert {c["smoothing"] for c in mine} > {None}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_loss_and_gradient_match_torch(case):
    loss, grad = _ember(case)
    assert loss.shape == (1,) and loss.dtype == np.float64 and grad.dtype == np.float64
    np.testing.assert_allclose(loss[0], case["loss"], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(grad, np.asarray(case["grad"]), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("case", CASES[::5], ids=[c["name"] for c in CASES[::5]])
def test_float32_inputs_match_torch_loosely(case):
    loss, grad = _ember(case, "float32")
    assert loss.dtype == np.float32 and grad.dtype == np.float32
    np.testing.assert_allclose(loss[0], case["loss"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad, np.asarray(case["grad"]), rtol=1e-3, atol=1e-5)


def test_live_torch_agrees():
    pytest.importorskip("torch")
    from tests.engine.nn.make_cross_entropy_fixtures import torch_reference

    for case in CASES[::7] + [c for c in CASES if "all-but-one" in c["name"]]:
        ref_loss, ref_grad = torch_reference(case)
        loss, grad = _ember(case)
        np.testing.assert_allclose(loss[0], ref_loss, rtol=1e-6, atol=1e-12, err_msg=case["name"])
        np.testing.assert_allclose(grad, np.asarray(ref_grad), rtol=1e-6, atol=1e-12, err_msg=case["name"])
