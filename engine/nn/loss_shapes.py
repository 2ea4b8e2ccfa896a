"""The losses' shape rules, declared for the classes of `loss.py` (engine.nn.spec).

They sit beside loss.py rather than in it only because that file is at the size limit (700 lines):
a new loss declares its rule at the end of its own file, as every other layer does.
"""
from __future__ import annotations

from ..shapes.dims import as_dim
from ..shapes.rules import NP_DTYPE, ONE, RuleError, Shape, expect, like, rows_like
from .loss import (BinaryCrossEntropyLoss, CosineEmbeddingLoss, CrossEntropyLoss, GaussianNLLLoss, HingeEmbeddingLoss,
                   HuberLoss, KLDivLoss, MarginRankingLoss, MseLoss, MultiMarginLoss, PoissonNllLoss, SmoothL1Loss,
                   SoftMarginLoss, TripletMarginLoss)
from .spec import declare

__all__: list = []


def _mse_shape(m, ins, ctx):
    like("assert_shape(targets, list(logits.dims()))", ins[0], ins[1])
    return ONE


def _bce_shape(m, ins, ctx):
    logits, targets = ins
    like("assert_shape(targets, list(logits.dims()))", logits, targets)
    if m.weights is not None and logits.rank > 1:
        w = Shape((as_dim(len(m.weights)),))
        expect("assert_shape(self.weights, [logits.dims()[-1]])", w, [logits.dims[-1]])
    return ONE


def _pred_targets_shape(m, ins, ctx):
    like("assert_shape(targets, list(predictions.dims()))", ins[0], ins[1])
    return ONE


def _smooth_l1_shape(m, ins, ctx):  # Burn's forward does not reduce
    like("assert_shape(targets, list(predictions.dims()))", ins[0], ins[1])
    return Shape(ins[0].dims)


def _hinge_shape(m, ins, ctx):
    like("assert_shape(target, list(input.dims()))", ins[0], ins[1])
    return ONE


def _margin_ranking_shape(m, ins, ctx):
    first, second, target = ins
    like("assert_shape(second, dims)", first, second)
    like("assert_shape(target, dims)", first, target)
    return ONE


def _gaussian_nll_shape(m, ins, ctx):
    inp, target, var = ins
    like("assert_shape(target, dims)", inp, target)
    like("assert_shape(var, dims)", inp, var)
    return ONE


def _cross_entropy_shape(m, ins, ctx):
    logits, targets = ins
    expect("assert_shape(logits, [None, None])", logits, [None, None])
    batch_size, _ = logits.dims
    expect("assert_shape(targets, [batch_size])", targets, [batch_size])
    if targets.dtype != "int":
        raise RuleError(f"CrossEntropyLoss: expected int class targets, got {NP_DTYPE[targets.dtype]}")
    return ONE


def _multi_margin_shape(m, ins, ctx):
    inp, target = ins
    expect("assert_shape(input, [None, None])", inp, [None, None])
    batch_size, _ = inp.dims
    expect("assert_shape(target, [batch_size])", target, [batch_size])
    return ONE


def _cosine_embedding_shape(m, ins, ctx):
    batch_size, _ = rows_like(("input1", "input2"), ins)
    expect("assert_shape(target, [batch_size])", ins[2], [batch_size])
    return ONE


def _triplet_shape(m, ins, ctx):
    rows_like(("anchor", "positive", "negative"), ins)
    return ONE


declare(MseLoss, SoftMarginLoss, shape=_mse_shape)
declare(BinaryCrossEntropyLoss, shape=_bce_shape)
declare(HuberLoss, KLDivLoss, PoissonNllLoss, shape=_pred_targets_shape)
declare(SmoothL1Loss, shape=_smooth_l1_shape)
declare(HingeEmbeddingLoss, shape=_hinge_shape)
declare(MarginRankingLoss, shape=_margin_ranking_shape)
declare(GaussianNLLLoss, shape=_gaussian_nll_shape)
declare(CrossEntropyLoss, shape=_cross_entropy_shape)
declare(MultiMarginLoss, shape=_multi_margin_shape)
declare(CosineEmbeddingLoss, shape=_cosine_embedding_shape)
declare(TripletMarginLoss, shape=_triplet_shape)
