"""Mixtures of experts: `GatedMlp` (one SwiGLU expert) and `SparseMoe` (top-k routing over experts).

    SparseMoe
      gate                  Linear [d_model, n_experts], no bias: the router
      experts.{e}           GatedMlp: gate_proj, up_proj, down_proj (Linear), SiLU
      shared_expert         GatedMlp or None (Qwen2-MoE: an expert every token goes through,
      shared_expert_gate    Linear [d_model, 1], scaled by sigmoid(shared_expert_gate(x)))

Routing (as transformers' Mixtral / Qwen-MoE blocks): `p = softmax(gate(x))` over the experts, the
`top_k` largest kept (renormalised to sum 1 when `normalize_top_k`), and each token's output is the
sum of its chosen experts' outputs times their weights. The computation is sparse: each expert runs
on the tokens routed to it only (gathered, then added back in expert order). The weights carry
gradients to the router; the choice of experts does not (it is not differentiable).

While a trace records the forward (ONNX export, the graph view: `engine.tensor.trace.is_active()`),
`SparseMoe` computes `dense_forward` instead: the same outputs from ops a graph holds (no host
choice of experts a trace would fix to the example's tokens). Every expert runs on every token and
is weighted by a `[..., n_experts]` matrix that is zero outside each token's top-k, so the exported
graph does `n_experts / top_k` times the experts' work of the sparse forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..shapes.rules import expect, float_input, same
from ..tensor import Tensor
from ..tensor import trace as _trace
from . import _ops
from ._base import Config, Layer, assert_shape, check_dtype, check_sizes
from .linear import LinearConfig
from .spec import declare

__all__ = ["GatedMlpConfig", "GatedMlp", "SparseMoeConfig", "SparseMoe"]


@dataclass
class GatedMlpConfig(Config):
    """Configuration of a [`GatedMlp`]: `d_model` -> `d_ff` -> `d_model`."""

    d_model: int
    d_ff: int
    bias: bool = False

    def init(self, device=None) -> "GatedMlp":
        return self.init_many(1, device)[0]

    def init_many(self, n: int, device=None) -> list["GatedMlp"]:
        """`n` experts of this config (a layer's 128 experts share their two Linear configs)."""
        check_sizes(self)
        into = LinearConfig(self.d_model, self.d_ff, bias=self.bias)
        out = LinearConfig(self.d_ff, self.d_model, bias=self.bias)
        return [GatedMlp(into.init(device), into.init(device), out.init(device)) for _ in range(n)]


class GatedMlp(Layer):
    """The SwiGLU feed-forward block of an expert: `down_proj(silu(gate_proj(x)) * up_proj(x))`."""

    def __init__(self, gate_proj, up_proj, down_proj):
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj

    def forward(self, input):
        """SwiGLU feed-forward.

        # Shapes

        - input: `[..., d_model]`
        - output: `[..., d_model]`
        """
        d_model = self.gate_proj.weight.shape[0]
        assert_shape(input, [..., d_model])
        return self.down_proj.forward(_ops.silu(self.gate_proj.forward(input)) * self.up_proj.forward(input))

    def custom_content(self, content):
        d_model, d_ff = self.gate_proj.weight.shape
        return content.add("d_model", d_model).add("d_ff", d_ff).optional()


@dataclass
class SparseMoeConfig(Config):
    """Configuration of a [`SparseMoe`]: `n_experts` experts of `d_ff`, `top_k` per token;
    `d_shared` (optional) the size of a shared expert gated by a sigmoid (Qwen2-MoE)."""

    d_model: int
    d_ff: int
    n_experts: int
    top_k: int
    normalize_top_k: bool = True
    d_shared: int | None = None

    def init(self, device=None) -> "SparseMoe":
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"SparseMoeConfig: expected 1 <= top_k <= n_experts ({self.n_experts}), "
                             f"found top_k={self.top_k}")
        expert = GatedMlpConfig(self.d_model, self.d_ff)
        shared = shared_gate = None
        if self.d_shared is not None:
            shared = GatedMlpConfig(self.d_model, self.d_shared).init(device)
            shared_gate = LinearConfig(self.d_model, 1, bias=False).init(device)
        return SparseMoe(LinearConfig(self.d_model, self.n_experts, bias=False).init(device),
                         expert.init_many(self.n_experts, device), self.top_k,
                         self.normalize_top_k, shared, shared_gate)


class SparseMoe(Layer):
    """A sparse mixture of experts (see the module docstring)."""

    def __init__(self, gate, experts, top_k: int, normalize_top_k: bool = True, shared_expert=None,
                 shared_expert_gate=None):
        super().__init__()
        self.gate = gate
        self.experts = list(experts)
        self.top_k = int(top_k)
        self.normalize_top_k = bool(normalize_top_k)
        self.shared_expert = shared_expert
        self.shared_expert_gate = shared_expert_gate

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def route(self, x: Tensor) -> tuple[Tensor, np.ndarray]:
        """(weights `[tokens, top_k]`, chosen experts `[tokens, top_k]` as a host int array, the
        largest weight first) for the tokens `x` (`[tokens, d_model]`)."""
        probs = self.gate.forward(x).softmax(-1)
        chosen = np.argsort(-np.asarray(probs.detach().numpy()), axis=-1, kind="stable")[:, : self.top_k]
        weights = probs.gather(1, Tensor.from_data(np.ascontiguousarray(chosen), device=x.device))
        if self.normalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, chosen

    def forward(self, input):
        """Each token through its `top_k` experts, weighted by the router (plus the shared expert).

        # Shapes

        - input: `[..., d_model]`
        - output: `[..., d_model]`
        """
        d_model = self.gate.weight.shape[0]
        assert_shape(input, [..., d_model])
        check_dtype(self, input, self.gate.weight.val())
        if _trace.is_active():  # a trace records ops a graph holds: the dense form (see the module docstring)
            return self.dense_forward(input)
        dims = input.dims()
        x = input.reshape(-1, d_model)
        weights, chosen = self.route(x)
        flat_weights = weights.reshape(-1)
        rows, outs = [], []
        for e, expert in enumerate(self.experts):
            tokens, slots = np.nonzero(chosen == e)
            if tokens.size == 0:
                continue  # an expert no token chose does not run
            w = flat_weights.select(0, tokens * self.top_k + slots).reshape(-1, 1)
            outs.append(expert.forward(x.select(0, tokens)) * w)
            rows.append(tokens)
        out = x.zeros_like().select_assign(0, np.concatenate(rows), Tensor.cat(outs, 0))
        if self.shared_expert is not None:
            out = out + self.shared_expert.forward(x) * self.shared_expert_gate.forward(x).sigmoid()
        return out.reshape(dims)

    def top_k_weights(self, x: Tensor) -> Tensor:
        """The routing weights `[..., n_experts]` of the tokens `x` (`[..., d_model]`): each token's
        `top_k` probabilities (renormalised when `normalize_top_k`), zero elsewhere, from comparisons
        alone (no host choice, no TopK). Expert `e` is kept when fewer than `top_k` experts beat it,
        `j` beating `e` when `p_j > p_e`, or `p_j == p_e` and `j < e`: ties keep the lowest index,
        as `route`'s stable sort."""
        probs = self.gate.forward(x).softmax(-1)
        n = self.n_experts
        earlier = Tensor.from_data(np.tril(np.ones((n, n), dtype=np.float32), -1), device=x.device)
        p_e, p_j = probs.unsqueeze(-1), probs.unsqueeze(-2)  # [..., e, 1], [..., 1, j]
        # counted in float32 (exact to 2**24 experts, whatever the model's dtype)
        beaten = p_j.greater(p_e).cast("float32").sum(-1) + (p_j.equal(p_e).cast("float32") * earlier).sum(-1)
        weights = probs.mask_fill(beaten.greater_equal(float(self.top_k)), 0.0)
        if self.normalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights

    def dense_forward(self, input):
        """`forward`'s outputs computed densely: every expert on every token, weighted by
        `top_k_weights` (zero outside the top-k), summed in expert order (as `forward` adds its
        experts' outputs); `n_experts / top_k` times the experts' work. What a trace records.

        # Shapes

        - input: `[..., d_model]`
        - output: `[..., d_model]`
        """
        weights = self.top_k_weights(input)
        out = None
        for e, expert in enumerate(self.experts):
            term = expert.forward(input) * weights[..., e : e + 1]
            out = term if out is None else out + term
        if self.shared_expert is not None:
            out = out + self.shared_expert.forward(input) * self.shared_expert_gate.forward(input).sigmoid()
        return out

    def custom_content(self, content):
        d_model, n_experts = self.gate.weight.shape
        return (content.add("d_model", d_model).add("n_experts", n_experts).add("top_k", self.top_k)
                .add("shared_expert", self.shared_expert is not None).optional())


def _moe_shape(m, ins, ctx):
    d_model = (m.gate if isinstance(m, SparseMoe) else m.gate_proj).weight.shape[0]
    expect("assert_shape(input, [..., d_model])", ins[0], [..., d_model])
    float_input(type(m).__name__, ins[0])
    return same(ins[0])


declare(GatedMlp, SparseMoe, shape=_moe_shape)
