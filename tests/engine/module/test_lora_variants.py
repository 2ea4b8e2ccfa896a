"""LoRA variants as reparameterizations (issue 20): rsLoRA's scale, DoRA's magnitudes (the value,
gradients against finite differences with the norm held constant as peft holds it, training,
records), per-layer rank and alpha patterns with peft's matching rule, display."""
import math

import numpy as np
import pytest

from engine import Device, Tensor, nn, optim
from engine.module import Module, ModuleMapper, Param, ParamGroup
from engine.module.lora import DoraAdapter, Lora, LoraAdapter, QLora, RsLoraAdapter, pattern_key
from engine.module.reparam import iter_param_slots
from engine.store import ModuleRecord
from tests.engine.gradcheck import numeric_grad


class Net(Module):
    def __init__(self, device=None):
        self.emb = nn.EmbeddingConfig(11, 6).init(device)
        self.fc1 = nn.LinearConfig(d_input=6, d_output=8).init(device)
        self.fc2 = nn.LinearConfig(d_input=8, d_output=5).init(device)

    def forward(self, ids):
        return self.fc2.forward(self.fc1.forward(self.emb.forward(ids)).tanh())


@pytest.fixture()
def net():
    Device("cpu").seed(3)
    return Net()


IDS = Tensor.from_data(np.array([[1, 4, 7], [10, 0, 2]], dtype=np.int64))


def _adapters(model):
    return {path: p.reparameterization for path, p in iter_param_slots(model) if p.reparameterization is not None}


class _Noise(ModuleMapper):
    """Seeded noise on every adapter field (b starts at zero: the factors become non-zero)."""

    def __init__(self, scale=0.3, seed=5):
        self.rng = np.random.default_rng(seed)
        self.scale = scale
        self.path = []

    def enter_module(self, name, ct):
        self.path.append(name)

    def exit_module(self, name, ct):
        self.path.pop()

    def map_float(self, param):
        if ".lora." not in ".".join(self.path):
            return param
        noise = (self.rng.standard_normal(param.shape) * self.scale).astype(np.float32)
        return param.map(lambda t: (t + Tensor.from_data(noise, device=t.device)).detach().require_grad())


def _noise(model):
    return model.map(_Noise())


# ---------------------------------------------------------------------------------- rsLoRA
def test_rslora_scale_is_alpha_over_sqrt_rank_and_the_value_follows(net):
    t = _noise(net.apply_lora(Lora(4, 6.0, use_rslora=True)))
    ad = t.fc1.weight.reparameterization
    assert isinstance(ad, RsLoraAdapter) and ad.scale == pytest.approx(6.0 / math.sqrt(4))
    assert Lora(4, 6.0).scale == 1.5 and Lora(4, 6.0, use_rslora=True).scale == 3.0
    w = net.fc1.weight.val().numpy() + 3.0 * ad.a.val().numpy() @ ad.b.val().numpy()
    np.testing.assert_allclose(t.fc1.weight.val().numpy(), w, rtol=1e-6, atol=1e-6)
    assert "RsLoraAdapter" in str(ad) and "scale: 3" in str(ad)
    assert "use_rslora=True" in repr(Lora(4, 6.0, use_rslora=True))


# ---------------------------------------------------------------------------------- DoRA
def test_dora_starts_as_the_identity_with_the_base_column_norms(net):
    t = net.apply_lora(Lora(3, 5.0, use_dora=True))
    for path in ("emb.weight", "fc1.weight", "fc2.weight"):
        ad = t.get_child(path).reparameterization
        assert isinstance(ad, DoraAdapter)
        w = net.get_child(path).val().numpy()
        np.testing.assert_allclose(ad.magnitude.val().numpy(), np.linalg.norm(w, axis=0), rtol=1e-6)
        assert ad.magnitude.shape == (w.shape[1],) and ad.magnitude.is_require_grad()
    np.testing.assert_allclose(t.forward(IDS).numpy(), net.forward(IDS).numpy(), rtol=1e-5, atol=1e-6)
    assert [p for p, _ in t.named_params()][:4] == ["emb.weight", "emb.weight.lora.a", "emb.weight.lora.b",
                                                    "emb.weight.lora.magnitude"]
    text = str(t.fc1.weight.reparameterization)
    assert text.startswith("DoraAdapter {") and "magnitude: ParamTensor {rank: 1, shape: [8]" in text


def test_dora_value_is_magnitude_times_the_column_normalized_weight(net):
    t = _noise(net.apply_lora(Lora(2, 4.0, use_dora=True)))
    ad = t.fc2.weight.reparameterization
    w0 = net.fc2.weight.val().numpy().astype(np.float64)
    v = w0 + ad.scale * ad.a.val().numpy() @ ad.b.val().numpy()
    expected = v * (ad.magnitude.val().numpy() / np.linalg.norm(v, axis=0))[None, :]
    np.testing.assert_allclose(t.fc2.weight.val().numpy(), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected, w0, atol=1e-3)


def test_dora_gradients_match_finite_differences_with_the_norm_held_constant():
    """peft (and the DoRA paper, section 4.3) detach ||W + s·a@b||: the gradient is that of
    m * (W + s·a@b) / n with n a constant."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((5, 4))
    a0, b0, m0 = rng.standard_normal((5, 2)), rng.standard_normal((2, 4)), rng.random(4) + 0.5
    s = 1.7
    probe = rng.standard_normal((5, 4))
    n0 = np.linalg.norm(w + s * a0 @ b0, axis=0)

    ts = [Tensor.from_data(x, dtype="float64").require_grad() for x in (a0, b0, m0)]
    ad = DoraAdapter(Param.initialized(ts[0]), Param.initialized(ts[1]), s, Param.initialized(ts[2]))
    out = ad.apply(Tensor.from_data(w, dtype="float64"))
    grads = (out * Tensor.from_data(probe, dtype="float64")).sum().backward()
    analytic = [t.grad(grads).numpy() for t in ts]

    def held(a, b, m):  # the norm at the point, held constant
        return float(((w + s * a @ b) * (m / n0)[None, :] * probe).sum())

    for i in range(3):
        numeric = numeric_grad(held, [a0, b0, m0], i)
        np.testing.assert_allclose(analytic[i], numeric, rtol=1e-6, atol=1e-7)

    def full(a, b, m):  # the norm differentiated too: a different gradient for a and b (not for m)
        v = w + s * a @ b
        return float((v * (m / np.linalg.norm(v, axis=0))[None, :] * probe).sum())

    assert not np.allclose(analytic[0], numeric_grad(full, [a0, b0, m0], 0), atol=1e-4)
    np.testing.assert_allclose(analytic[2], numeric_grad(full, [a0, b0, m0], 2), rtol=1e-6, atol=1e-7)


def test_dora_fine_tunes_and_its_record_round_trips(net, tmp_path):
    rng = np.random.default_rng(0)
    y = Tensor.from_data(rng.standard_normal((2, 3, 5)).astype(np.float32))
    t = net.apply_lora(Lora(2, 4.0, use_dora=True, param_group=ParamGroup.from_regex(r"^fc")))
    opt = optim.AdamConfig().init()
    losses = []
    for _ in range(30):
        d = t.forward(IDS) - y
        loss = (d * d).mean()
        losses.append(loss.item())
        t = opt.step(0.02, t, optim.GradientsParams.from_grads(loss.backward(), t))
    assert losses[-1] < 0.7 * losses[0]
    np.testing.assert_array_equal(t.fc1.weight.base().numpy(), net.fc1.weight.val().numpy())  # base frozen
    assert not np.allclose(t.fc1.weight.reparameterization.magnitude.val().numpy(),
                           np.linalg.norm(net.fc1.weight.val().numpy(), axis=0))  # the magnitude trained
    path = t.valid().into_record().save(tmp_path / "dora")
    fresh = net.apply_lora(Lora(2, 4.0, use_dora=True, param_group=ParamGroup.from_regex(r"^fc"))).valid()
    restored = fresh.load_record(ModuleRecord.load(path))
    np.testing.assert_array_equal(restored.forward(IDS).numpy(), t.valid().forward(IDS).numpy())
    merged = t.valid().materialize()
    np.testing.assert_allclose(merged.forward(IDS).numpy(), t.valid().forward(IDS).numpy(), rtol=1e-5, atol=1e-6)


def test_qlora_refuses_dora():
    with pytest.raises(ValueError, match="DoRA over an NF4-packed base is not supported"):
        QLora(Lora(2, 4.0, use_dora=True))


# ---------------------------------------------------------------------------------- patterns
def test_pattern_key_matches_as_peft_does():
    keys = ["o_proj", r"layers\.1\.mlp\.up_proj", "proj"]
    assert pattern_key(keys, "model.layers.0.self_attn.o_proj") == "o_proj"
    assert pattern_key(keys, "model.layers.1.mlp.up_proj") == r"layers\.1\.mlp\.up_proj"
    assert pattern_key(keys, "model.layers.0.mlp.up_proj") is None  # "proj" must follow a dot
    assert pattern_key(["up_proj"], "model.layers.0.mlp.up_proj") == "up_proj"
    assert pattern_key(["p_proj"], "model.layers.0.mlp.up_proj") is None


def test_rank_and_alpha_patterns_give_per_layer_factors(net):
    lora = Lora(4, 8.0, rank_pattern={"fc2": 2}, alpha_pattern={"fc1": 2.0, "emb": 1.0})
    t = net.apply_lora(lora)
    ads = {p: r for p, r in _adapters(t).items()}
    assert ads["fc1.weight"].a.shape == (6, 4) and ads["fc1.weight"].scale == 2.0 / 4
    assert ads["fc2.weight"].a.shape == (8, 2) and ads["fc2.weight"].b.shape == (2, 5)
    assert ads["fc2.weight"].scale == 8.0 / 2
    assert ads["emb.weight"].scale == 1.0 / 4
    assert lora.preview(net.named_params()).added == 4 * (11 + 6) + 4 * (6 + 8) + 2 * (8 + 5)
    # module names given (e.g. Hugging Face's) are what the patterns match
    named = Lora(4, 8.0, rank_pattern={"q_proj": 3}, module_names={"fc1.weight": "model.layers.0.self_attn.q_proj"})
    assert named.rank_for("fc1.weight") == 3 and named.rank_for("fc2.weight") == 4
    # the variants survive set_param_group / set_dtype
    again = lora.set_param_group(ParamGroup.from_regex("fc")).set_dtype("float32")
    assert again.rank_pattern == {"fc2": 2} and again.alpha_pattern == lora.alpha_pattern
    assert Lora(2, 1.0, use_dora=True, use_rslora=True).set_param_group(ParamGroup.all()).use_dora


def test_bad_patterns_are_refused():
    with pytest.raises(ValueError, match=r"rank_pattern\['fc1'\] must be a positive integer"):
        Lora(4, 8.0, rank_pattern={"fc1": 0})
    with pytest.raises(ValueError, match="not a valid regex"):
        Lora(4, 8.0, alpha_pattern={"fc1(": 2.0})
    with pytest.raises(ValueError, match="alpha_pattern must be a dict"):
        Lora(4, 8.0, alpha_pattern=["fc1"])


def test_plain_lora_is_unchanged(net):
    t = net.apply_lora(Lora(4, 8.0))
    assert all(type(r) is LoraAdapter for r in _adapters(t).values())
    np.testing.assert_array_equal(t.forward(IDS).numpy(), net.forward(IDS).numpy())
