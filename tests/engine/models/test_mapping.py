"""The weight-map transforms: shapes, inverses, and the rotary permutation against an
independent halves-rotation (Hugging Face's `rotate_half` form) written here with NumPy."""
import numpy as np
import pytest

from engine import Tensor, nn
from engine.models.mapping import Reshape, RopePermute, Rule, Split, Transpose, WeightMap


def _hf_rope(x, theta=10000.0):
    """Hugging Face Llama's rotary embedding: rotates halves (i, i + d/2). x: [heads, seq, d]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(x.shape[-2])[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)
    sin = np.concatenate([np.sin(ang)] * 2, -1)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("heads,hd", [(1, 2), (3, 8), (4, 16)])
def test_rope_permute_makes_interleaved_rotary_give_hf_scores(heads, hd):
    rng = np.random.default_rng(heads * 100 + hd)
    d_model, seq = 12, 5
    wq = rng.normal(size=(heads * hd, d_model))  # PyTorch layout [out, in]
    wk = rng.normal(size=(heads * hd, d_model))
    x = rng.normal(size=(seq, d_model))

    def hf(w):
        return _hf_rope((x @ w.T).reshape(seq, heads, hd).transpose(1, 0, 2))
    scores_hf = hf(wq) @ hf(wk).transpose(0, 2, 1)

    rule = Rule("q.weight", "query.weight", [RopePermute(heads, hd), Transpose()])
    rope = nn.RotaryEncodingConfig(seq, hd).init()

    def ember(w):
        w_e = rule.load(w)  # [in, out], rows permuted per head
        q = Tensor.from_data((x @ w_e).reshape(seq, heads, hd).transpose(1, 0, 2), dtype="float64")
        return rope.forward(q).numpy()
    scores_em = ember(wq) @ ember(wk).transpose(0, 2, 1)
    np.testing.assert_allclose(scores_em, scores_hf, rtol=1e-5, atol=1e-5)
    # without the permutation the scores differ: the test can fail
    plain = Rule("q.weight", "query.weight", [Transpose()])
    if hd > 2:
        def ember_plain(w):
            q = Tensor.from_data((x @ plain.load(w)).reshape(seq, heads, hd).transpose(1, 0, 2), dtype="float64")
            return rope.forward(q).numpy()
        assert not np.allclose(ember_plain(wq) @ ember_plain(wk).transpose(0, 2, 1), scores_hf, atol=1e-3)


def test_rules_invert_exactly_and_know_their_shapes():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(24, 7)).astype(np.float32)
    rule = Rule("a.{i}.q.weight", "b.{i}.query.weight", [RopePermute(3, 8), Transpose()])
    assert rule.match_ember("b.11.query.weight") == "a.11.q.weight"
    assert rule.match_ember("b.x.query.weight") is None and rule.match_ember("b.1.query.weight.lora") is None
    assert rule.ember_shape((24, 7)) == (7, 24) and rule.stored_shape((7, 24)) == (24, 7)
    assert np.array_equal(rule.save(rule.load(w)), w)
    b = rng.normal(size=(24,)).astype(np.float32)
    rb = Rule("q.bias", "query.bias", [RopePermute(3, 8)])
    assert np.array_equal(rb.save(rb.load(b)), b) and not np.array_equal(rb.load(b), b)
    with pytest.raises(ValueError, match="needs 24 along axis 0, found dims \\[25, 7\\]"):
        rule.ember_shape((25, 7))
    r = Rule("cls", "cls_token", [Reshape((1, 1, 4), (4,))])
    assert r.ember_shape((1, 1, 4)) == (4,) and r.stored_shape((4,)) == (1, 1, 4)


def test_split_parts_and_bad_rules():
    fused = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)
    parts = [Rule("c", f"p{i}", [Split(1, i, 3)]).load(fused) for i in range(3)]
    assert np.array_equal(np.concatenate(parts, 1), fused)
    with pytest.raises(ValueError, match="multiple of 3"):
        Rule("c", "p", [Split(1, 0, 3)]).ember_shape((2, 8))
    with pytest.raises(ValueError, match="same placeholders"):
        Rule("a.{i}.w", "b.w")
    with pytest.raises(ValueError, match="Split must be the first"):
        Rule("a", "b", [Transpose(), Split(0, 0, 2)])
    wm = WeightMap([Rule("x.{i}", "y.{i}")], ignore=[r"inv_freq$"])
    assert wm.find("y.3")[1] == "x.3" and wm.find("z") is None
    assert wm.ignored("model.rotary_emb.inv_freq") and not wm.ignored("x.3")


def test_find_takes_the_first_rule_that_covers_a_path_as_each_rule_alone_would():
    rules = [Rule("a.{i}.b%x.{e}", "l.{e}.experts.{i}.w"),  # placeholders in the other order, a literal %
             Rule("first.{i}", "layers.{i}.w"),
             Rule("second.{i}", "layers.{i}.w"),  # never reached: the rule before covers the same paths
             Rule("plain.weight", "norm.gamma"),
             Rule("h.{i}.q.{j}", "h.{i}.{j}.q")]
    wmap = WeightMap(rules)
    paths = ["l.7.experts.12.w", "layers.3.w", "norm.gamma", "h.0.10.q", "layers.x.w", "layers.3.w.extra",
             "xlayers.3.w", "norm.gammas", "h.1.2.q.r"]
    for path in paths:
        alone = next(((r, r.match_ember(path)) for r in rules if r.match_ember(path) is not None), None)
        assert wmap.find(path) == alone, path
    assert wmap.find("l.7.experts.12.w")[1] == "a.12.b%x.7"
    assert wmap.find("layers.3.w") == (rules[1], "first.3")
    assert wmap.find("layers.x.w") is None and wmap.find("norm.gammas") is None
    wmap.rules.insert(0, Rule("zero.{i}", "layers.{i}.w"))  # a changed rules list is matched as it now is
    assert wmap.find("layers.3.w")[1] == "zero.3"
    assert WeightMap([]).find("anything") is None


def test_canonical_without_aliases_keeps_the_names_and_their_refusals():
    wmap = WeightMap([Rule("a.{i}", "b.{i}")])
    assert wmap.canonical(["a.1", "a.2"]) == {"a.1": "a.1", "a.2": "a.2"}
    with pytest.raises(Exception, match="empty name"):
        wmap.canonical(["a.1", ""])
    with pytest.raises(Exception, match="maps both"):
        wmap.canonical(["a.1", "a.1"])
    kept = WeightMap([Rule("a.{i}", "b.{i}")], ignore=[r"inv_freq$"]).kept(["a.1", "x.inv_freq", "a.2"])
    assert kept == ["a.1", "a.2"]
