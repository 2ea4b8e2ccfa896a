"""Backward releases the graph: a long training loop keeps resident memory flat, and the
arrays a graph saved are freed by backward even while the loss tensor lives on."""
from __future__ import annotations

import gc
import os
import weakref

import numpy as np

from engine import Tensor

B, D_IN, D_H, D_OUT, LR = 32, 64, 32, 10, 0.05


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_problem(seed=0):
    rng = np.random.default_rng(seed)
    x = Tensor.from_data(rng.standard_normal((B, D_IN), dtype=np.float32))
    y = Tensor.from_data(rng.integers(0, D_OUT, B)).one_hot(D_OUT, dtype="float32")
    params = [
        Tensor.from_data(rng.standard_normal((D_IN, D_H), dtype=np.float32) * 0.1).require_grad(),
        Tensor.zeros((D_H,)).require_grad(),
        Tensor.from_data(rng.standard_normal((D_H, D_OUT), dtype=np.float32) * 0.1).require_grad(),
        Tensor.zeros((D_OUT,)).require_grad(),
    ]
    return x, y, params


def forward(x, y, params):
    w1, b1, w2, b2 = params
    h = (x @ w1 + b1).relu()
    logits = h @ w2 + b2
    loss = -(logits.log_softmax(1) * y).sum() * (1.0 / B)
    return loss, weakref.ref(h._data)


def sgd(params, grads):
    return [(p - p.grad(grads) * LR).detach().require_grad() for p in params]


def test_backward_frees_saved_arrays_while_the_loss_lives():
    x, y, params = make_problem()
    gc.disable()  # everything below must be freed by reference counting alone (no cycles)
    try:
        loss, h_ref = forward(x, y, params)
        node_ref = weakref.ref(loss._node)
        assert h_ref() is not None  # the recorded rules hold the hidden activations
        grads = loss.backward()
        assert h_ref() is None  # released by backward, although `loss` is still referenced
        assert loss._node.released and loss._node.rule is None and loss._node.parents is None
        params = sgd(params, grads)
        del loss, grads
        assert node_ref() is None
    finally:
        gc.enable()


def test_two_thousand_training_steps_keep_memory_flat():
    x, y, params = make_problem()
    losses = []
    rss_200 = None
    for step in range(1, 2001):
        loss, _ = forward(x, y, params)
        grads = loss.backward()
        params = sgd(params, grads)
        if step % 100 == 0:
            losses.append(float(loss.item()))
        if step == 200:
            gc.collect()
            rss_200 = rss_bytes()
    gc.collect()
    growth = rss_bytes() - rss_200
    assert growth < 5 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MiB between step 200 and step 2000"
    assert losses[-1] < losses[0] * 0.5  # it does learn: the loop is real training
    # the last graph is gone as well
    node_ref = weakref.ref(loss._node)
    del loss, grads
    assert node_ref() is None


def test_the_graph_keeps_only_the_arrays_its_rules_read():
    # add's rule needs only shapes and relu's only its output: the matmul and add results are
    # freed as soon as the forward pass drops them, while the graph (and its rules) live on
    x, y, params = make_problem()
    w1, b1, w2, b2 = params
    gc.disable()
    try:
        mm = x @ w1
        mm_ref = weakref.ref(mm._data)
        z = mm + b1
        z_ref = weakref.ref(z._data)
        h = z.relu()
        del mm, z
        assert mm_ref() is None and z_ref() is None
        loss = (h * h).sum()
        grads = loss.backward()
        # the gradients are still right without the freed arrays: d/dW1 sum(relu(xW1+b1)^2)
        hd = h.numpy()
        np.testing.assert_allclose(w1.grad(grads).numpy(), x.numpy().T @ (2 * hd), rtol=1e-5)
        np.testing.assert_allclose(b1.grad(grads).numpy(), (2 * hd).sum(0), rtol=1e-5)
    finally:
        gc.enable()
