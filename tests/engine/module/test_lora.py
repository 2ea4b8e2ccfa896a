"""LoRA and QLoRA (engine.module.lora): initialization, the effective weight, gradients, records,
adapter-only export, materialization and fine-tuning a frozen pre-trained MLP."""
import numpy as np
import pytest

from engine import Device, Tensor, nn, optim
from engine.module import Module, ModuleMapper, Param, ParamGroup
from engine.module.lora import Lora, LoraAdapter, NF4Weight, QLora, QLoraAdapter
from engine.module.nf4 import NF4_CODE, quantize_nf4
from engine.module.reparam import ReparameterizationError
from engine.store import ModuleRecord
from tests.engine.gradcheck import check_grads

ADAPTERS = r"(^|\.)lora\.(a|b)$"


class Mlp(Module):
    def __init__(self, device=None, d_in=4, d_hidden=32, d_out=3):
        self.fc1 = nn.LinearConfig(d_input=d_in, d_output=d_hidden).init(device)
        self.fc2 = nn.LinearConfig(d_input=d_hidden, d_output=d_out).init(device)

    def forward(self, x):
        return self.fc2.forward(self.fc1.forward(x).tanh())


def _data(n=64, d_in=4, d_out=3, seed=0, shift=0.0, device=None):
    """A smooth regression task; `shift` changes the target map (the 'shifted task')."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = np.random.default_rng(100).standard_normal((d_in, d_out)).astype(np.float32)
    w_shift = np.random.default_rng(101).standard_normal((d_in, d_out)).astype(np.float32)
    y = np.sin(x @ (w + shift * w_shift)).astype(np.float32)
    return Tensor.from_data(x, device=device), Tensor.from_data(y, device=device)


def _mse(model, x, y):
    d = model.forward(x) - y
    return (d * d).mean()


def _train(model, x, y, steps, lr, opt=None):
    opt = opt or optim.AdamConfig().init()
    losses = []
    for _ in range(steps):
        loss = _mse(model, x, y)
        losses.append(loss.item())
        grads = optim.GradientsParams.from_grads(loss.backward(), model)
        model = opt.step(lr, model, grads)
    losses.append(_mse(model, x, y).item())
    return model, losses


class _Perturb(ModuleMapper):
    """Seeded noise on every float parameter whose path matches `pattern` (a regex)."""

    def __init__(self, pattern=ADAPTERS, scale=0.3, seed=7):
        import re

        self.rx = re.compile(pattern)
        self.scale = scale
        self.rng = np.random.default_rng(seed)
        self.path = []

    def enter_module(self, name, ct):
        self.path.append(name)

    def exit_module(self, name, ct):
        self.path.pop()

    def map_float(self, param):
        if not self.rx.search(".".join(self.path)):
            return param
        noise = (self.rng.standard_normal(param.shape) * self.scale).astype(np.float32)
        return param.map(lambda t: (t + Tensor.from_data(noise, device=t.device)).detach().require_grad())


@pytest.fixture(scope="module")
def pretrained():
    """An MLP trained on the original task (its weights then stay frozen)."""
    Device("cpu").seed(11)
    x, y = _data()
    model, losses = _train(Mlp(), x, y, steps=150, lr=0.02)
    assert losses[-1] < 0.5 * losses[0]
    return model.no_grad().valid().train()  # plain, initialized weights


# ---------------------------------------------------------------------------------- LoRA
def test_output_unchanged_right_after_apply_lora(pretrained):
    x, _ = _data(seed=1)
    tuned = pretrained.apply_lora(Lora(4, 8.0))
    np.testing.assert_array_equal(tuned.forward(x).numpy(), pretrained.forward(x).numpy())


def test_lora_freezes_every_float_parameter_and_adds_trainable_factors():
    m = Mlp().unfreeze()
    t = m.apply_lora(Lora(2, 4.0))
    for path in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]:
        p = dict(t.named_params())[path]
        assert not p.is_require_grad() and not p.is_active(), path
    for path, d_in, d_out in [("fc1.weight", 4, 32), ("fc2.weight", 32, 3)]:
        ad = t.get_child(path).reparameterization
        assert isinstance(ad, LoraAdapter) and ad.scale == 2.0
        assert ad.a.shape == (d_in, 2) and ad.b.shape == (2, d_out)
        assert ad.a.is_require_grad() and ad.b.is_require_grad()
        assert np.all(ad.b.val().numpy() == 0)
        assert len({ad.a.id, ad.b.id, t.get_child(path).id}) == 3
    assert t.fc1.bias.reparameterization is None
    assert [p for p, _ in t.named_params()] == [
        "fc1.weight", "fc1.weight.lora.a", "fc1.weight.lora.b", "fc1.bias",
        "fc2.weight", "fc2.weight.lora.a", "fc2.weight.lora.b", "fc2.bias"]
    assert t.num_params() == m.num_params() + 2 * (4 + 32) + 2 * (32 + 3)


@pytest.mark.parametrize("rank, init_std, expected", [(4, None, 0.25), (2, None, 0.5), (4, 0.02, 0.02)])
def test_factor_a_is_normal_with_std_one_over_rank_or_init_std(rank, init_std, expected):
    class Wide(Module):
        def __init__(self):
            self.w = Param(Tensor.zeros([4000, 3]))

    a = Wide().apply_lora(Lora(rank, 1.0, init_std=init_std)).w.reparameterization.a.val().numpy()
    assert a.shape == (4000, rank) and a.dtype == np.float32
    assert abs(a.mean()) < 0.05 * expected
    assert a.std() == pytest.approx(expected, rel=0.03)


def test_factors_come_from_the_device_generator_and_dtype():
    dev = Device("cpu:2")
    dev.seed(5)
    a1 = Mlp(dev).apply_lora(Lora(2, 1.0)).fc1.weight.reparameterization.a
    dev.seed(5)
    a2 = Mlp(dev).apply_lora(Lora(2, 1.0)).fc1.weight.reparameterization.a
    assert a1.device == dev
    np.testing.assert_array_equal(a1.val().numpy(), a2.val().numpy())

    class F64(Module):
        def __init__(self):
            self.w = Param(Tensor.zeros([3, 5], dtype="float64"))

    ad = F64().apply_lora(Lora(2, 1.0)).w.reparameterization
    assert ad.a.val().dtype == "float64" and ad.b.val().dtype == "float64"


def test_effective_weight_equals_base_plus_scaled_product(pretrained):
    t = pretrained.apply_lora(Lora(4, 10.0)).map(_Perturb())
    w = t.fc1.weight
    ad = w.reparameterization
    a, b = ad.a.val().numpy(), ad.b.val().numpy()
    assert np.abs(b).max() > 0.1
    expected = pretrained.fc1.weight.val().numpy() + (10.0 / 4) * (a @ b)
    np.testing.assert_allclose(w.val().numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(w.base().numpy(), pretrained.fc1.weight.val().numpy())


def test_lora_gradients_reach_only_the_factors_and_match_finite_differences(pretrained):
    t = pretrained.apply_lora(Lora(2, 4.0)).map(_Perturb())
    x, y = _data(seed=2)
    grads = _mse(t, x, y).backward()
    assert t.fc1.weight.base().grad(grads) is None
    assert t.fc1.bias.val().grad(grads) is None
    assert t.fc1.weight.reparameterization.a.val().grad(grads) is not None
    assert t.fc1.weight.reparameterization.b.val().grad(grads) is not None

    rng = np.random.default_rng(4)

    def fn(base, a, b):
        return LoraAdapter(Param.initialized(a), Param.initialized(b), 1.5).apply(base)

    check_grads(fn, rng.standard_normal((3, 4)), rng.standard_normal((3, 2)), rng.standard_normal((2, 4)))


def test_param_group_limits_adapters_but_everything_is_frozen():
    t = Mlp().apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_predicate("fc2")))
    assert t.fc1.weight.reparameterization is None and not t.fc1.weight.is_require_grad()
    assert isinstance(t.fc2.weight.reparameterization, LoraAdapter)
    t2 = Mlp().apply_lora(Lora(2, 4.0).set_param_group(ParamGroup.from_path("fc1.weight")))
    assert t2.fc2.weight.reparameterization is None and t2.fc1.weight.reparameterization is not None


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError, match="rank must be a positive integer, got 0"):
        Lora(0, 1.0)
    with pytest.raises(ValueError, match="init_std must be a positive number"):
        Lora(2, 1.0, init_std=-1.0)
    with pytest.raises(TypeError, match="param_group must be a ParamGroup"):
        Lora(2, 1.0, param_group="fc1")
    with pytest.raises(TypeError, match="expects a Lora"):
        QLora(2)
    with pytest.raises(ValueError, match="block_size must be a positive even integer, got 63"):
        QLora(Lora(2, 1.0), block_size=63)
    with pytest.raises(TypeError, match="apply_lora expects a Lora, got QLora"):
        Mlp().apply_lora(QLora(Lora(2, 1.0)))
    with pytest.raises(TypeError, match="apply_qlora expects a QLora, got Lora"):
        Mlp().apply_qlora(Lora(2, 1.0))


def test_lora_twice_is_refused():
    t = Mlp().apply_lora(Lora(2, 4.0))
    with pytest.raises(ReparameterizationError, match="cannot be nested"):
        t.apply_lora(Lora(2, 4.0))
    with pytest.raises(ReparameterizationError, match="cannot be nested"):
        t.apply_qlora(QLora(Lora(2, 4.0)))


def test_materialize_gives_the_same_outputs_without_factors(pretrained):
    t = pretrained.apply_lora(Lora(4, 8.0)).map(_Perturb())
    merged = t.materialize()
    x, _ = _data(seed=3)
    np.testing.assert_allclose(merged.forward(x).numpy(), t.forward(x).numpy(), rtol=1e-6, atol=1e-6)
    assert [p for p, _ in merged.named_params()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert merged.num_params() == pretrained.num_params()
    assert merged.fc1.weight.id == pretrained.fc1.weight.id
    assert not merged.fc1.weight.is_require_grad()  # the base's state: frozen
    assert isinstance(t.fc1.weight.reparameterization, LoraAdapter)  # the original keeps its adapters


def test_valid_keeps_adapters_and_records_both():
    t = Mlp().apply_lora(Lora(2, 4.0))
    v = t.valid()
    assert isinstance(v.fc1.weight.reparameterization, LoraAdapter)
    assert not v.fc1.weight.reparameterization.a.is_autodiff()
    assert v.fc1.weight.reparameterization.a.is_active()
    names = v.into_record().names()
    assert {"fc1.weight", "fc1.weight.lora.a", "fc1.weight.lora.b", "fc1.bias"} <= set(names)
    back = v.train()
    assert back.fc1.weight.reparameterization.a.is_require_grad()
    assert not back.fc1.weight.is_require_grad()


@pytest.mark.parametrize("qlora", [False, True])
def test_applied_to_a_validation_module_the_factors_follow_its_state(qlora):
    v = Mlp().valid()
    t = v.apply_qlora(QLora(Lora(2, 4.0))) if qlora else v.apply_lora(Lora(2, 4.0))
    ad = t.fc1.weight.reparameterization
    assert not ad.a.is_autodiff() and not ad.a.is_require_grad() and ad.a.is_active()
    assert not t.fc1.weight.is_autodiff()
    assert not t.forward(_data()[0]).is_autodiff()
    trained = t.train()
    assert trained.fc1.weight.reparameterization.a.is_require_grad()
    assert not trained.fc1.weight.is_require_grad()


def test_adapter_only_round_trip_gives_identical_outputs(pretrained, tmp_path):
    x, y = _data(shift=1.0)
    tuned, _ = _train(pretrained.apply_lora(Lora(4, 8.0)), x, y, steps=5, lr=0.01)
    adapters = ParamGroup.from_regex(ADAPTERS)
    rec = tuned.valid().into_record_group(adapters)
    assert rec.names() == ["fc1.weight.lora.a", "fc1.weight.lora.b", "fc2.weight.lora.a", "fc2.weight.lora.b"]
    path = rec.save(tmp_path / "adapters")
    restored = pretrained.apply_lora(Lora(4, 8.0)).valid().load_record(
        ModuleRecord.load(path).allow_partial(True))
    np.testing.assert_array_equal(restored.forward(x).numpy(), tuned.valid().forward(x).numpy())
    assert restored.fc1.weight.reparameterization.a.id == tuned.fc1.weight.reparameterization.a.id


def test_lora_module_moves_between_devices():
    m = Mlp()
    t = m.apply_lora(Lora(2, 4.0)).map(_Perturb())
    x, _ = _data(seed=5)
    expected = t.forward(x).numpy()
    dst = Device("cpu:1")
    moved = t.fork(dst)
    assert moved.devices() == [dst]
    np.testing.assert_allclose(moved.forward(x.to_device(dst)).numpy(), expected, rtol=1e-6)


# ---------------------------------------------------------------------------------- QLoRA
def test_qlora_packs_the_base_and_attaches_lora(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0), double_quant=False))
    w = q.fc1.weight
    ad = w.reparameterization
    assert isinstance(ad, QLoraAdapter) and isinstance(ad.nf4, NF4Weight)
    assert w.shape == (4, 32) and w.kind == "float"  # the logical weight, for layers
    original = pretrained.fc1.weight.val().numpy()
    ref = quantize_nf4(original, 64)
    np.testing.assert_array_equal(ad.nf4.codes.val().numpy(), ref.codes)
    np.testing.assert_array_equal(ad.nf4.absmax.val().numpy(), ref.absmax)
    # with b = 0 the value is the dequantized weight: code value x block absmax
    deq = w.val().numpy()
    block = np.arange(original.size) // 64
    np.testing.assert_array_equal(deq.reshape(-1), NF4_CODE[ref.code_indices()] * ref.absmax[block])
    np.testing.assert_array_equal(ad.base().numpy(), deq)
    rel = np.linalg.norm(deq - original) / np.linalg.norm(original)
    assert 0 < rel < 0.15
    # biases stay dense and frozen
    assert q.fc1.bias.reparameterization is None and not q.fc1.bias.is_require_grad()


def test_qlora_outputs_match_the_dequantized_model(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0)))

    class Deq(ModuleMapper):
        def map_float(self, param):
            if param.rank != 2:
                return param
            return param.map(lambda t: Tensor.from_data(quantize_nf4(t.numpy(), 64, True).dequantize()))

    reference = pretrained.map(Deq())
    x, _ = _data(seed=6)
    np.testing.assert_allclose(q.forward(x).numpy(), reference.forward(x).numpy(), rtol=1e-6, atol=1e-6)


def test_qlora_effective_weight_and_gradients_reach_only_the_factors(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(2, 4.0))).map(_Perturb())
    ad = q.fc2.weight.reparameterization
    expected = ad.nf4.dequantize().numpy() + 2.0 * (ad.a.val().numpy() @ ad.b.val().numpy())
    np.testing.assert_allclose(q.fc2.weight.val().numpy(), expected, rtol=1e-6, atol=1e-6)

    x, y = _data(seed=7)
    grads = _mse(q, x, y).backward()
    with_grad = [path for path, p in q.named_params() if p.is_initialized() and p.base().grad(grads) is not None]
    assert with_grad == ["fc1.weight.lora.a", "fc1.weight.lora.b", "fc2.weight.lora.a", "fc2.weight.lora.b"]

    rng = np.random.default_rng(8)
    nf4 = NF4Weight.from_packed(quantize_nf4(rng.standard_normal((3, 4)), 4, False), Device("cpu"))

    def fn(placeholder, a, b):
        return QLoraAdapter(Param.initialized(a), Param.initialized(b), 0.5, nf4).apply(placeholder)

    check_grads(fn, np.zeros((3, 4)), rng.standard_normal((3, 2)), rng.standard_normal((2, 4)))


def test_qlora_record_stores_the_packed_base_and_round_trips(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0))).map(_Perturb())
    rec = q.into_record()
    n_blocks = (4 * 32 + 63) // 64
    assert rec["fc1.weight.lora.nf4.codes"].dtype == "U8"
    assert rec["fc1.weight.lora.nf4.codes"].shape == (n_blocks * 32,)
    assert rec["fc1.weight.lora.nf4.absmax_q"].dtype == "I8"
    assert rec["fc1.weight.lora.nf4.absmax_q"].shape == (n_blocks,)
    assert rec["fc1.weight.lora.nf4.absmax_scale"].dtype == "F32"
    assert rec["fc1.weight.lora.nf4.absmax_mean"].shape == (1,)
    assert "fc1.weight.lora.nf4.absmax" not in rec
    plain = pretrained.apply_qlora(QLora(Lora(4, 8.0), double_quant=False)).into_record()
    assert plain["fc1.weight.lora.nf4.absmax"].dtype == "F32" and "fc1.weight.lora.nf4.absmax_q" not in plain

    # a model packed from other weights takes everything from the record
    other = Mlp().apply_qlora(QLora(Lora(4, 8.0)))
    loaded = other.load_record(ModuleRecord.from_bytes(rec.to_bytes()))
    x, _ = _data(seed=9)
    np.testing.assert_array_equal(loaded.forward(x).numpy(), q.forward(x).numpy())


def test_qlora_adapter_only_round_trip(pretrained):
    x, y = _data(shift=1.0)
    tuned, _ = _train(pretrained.apply_qlora(QLora(Lora(4, 8.0))), x, y, steps=5, lr=0.01)
    rec = tuned.valid().into_record_group(ParamGroup.from_regex(ADAPTERS))
    assert all(n.endswith((".lora.a", ".lora.b")) for n in rec.names()) and len(rec) == 4
    restored = pretrained.apply_qlora(QLora(Lora(4, 8.0))).valid().load_record(
        ModuleRecord.from_bytes(rec.to_bytes()).allow_partial(True))
    np.testing.assert_array_equal(restored.forward(x).numpy(), tuned.valid().forward(x).numpy())


def test_qlora_materialize_gives_dense_weights(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0))).map(_Perturb())
    merged = q.materialize()
    x, _ = _data(seed=10)
    np.testing.assert_allclose(merged.forward(x).numpy(), q.forward(x).numpy(), rtol=1e-6, atol=1e-6)
    assert [p for p, _ in merged.named_params()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    w = merged.fc1.weight.val()
    assert w.dtype == "float32" and w.shape == (4, 32) and w._data.strides[0] != 0  # dense, not a view
    assert isinstance(q.fc1.weight.reparameterization, QLoraAdapter)


def test_qlora_moves_between_devices(pretrained):
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0))).map(_Perturb())
    x, _ = _data(seed=11)
    expected = q.forward(x).numpy()
    dst = Device("cpu:1")
    moved = q.to_device(dst)
    assert moved.devices() == [dst]
    assert moved.fc1.weight.reparameterization.nf4.codes.device == dst
    np.testing.assert_array_equal(moved.forward(x.to_device(dst)).numpy(), expected)


# ---------------------------------------------------------------------------------- fine-tuning
def _frozen_values(model):
    return {path: p.base().numpy().copy() for path, p in model.named_params() if not p.is_active()}


@pytest.mark.parametrize("kind", ["lora", "qlora"])
def test_fine_tune_on_a_shifted_task_lowers_the_loss_and_keeps_every_base_weight(pretrained, kind):
    Device("cpu").seed(21)
    x, y = _data(shift=1.0)
    lora = Lora(4, 8.0)
    tuned = pretrained.apply_lora(lora) if kind == "lora" else pretrained.apply_qlora(QLora(lora))
    before = _frozen_values(tuned)
    assert len(before) >= 4  # biases and bases (and, for QLoRA, the packed codes and constants)
    tuned, losses = _train(tuned, x, y, steps=60, lr=0.02)
    assert losses[-1] < 0.6 * losses[0], losses[::10]
    after = _frozen_values(tuned)
    assert after.keys() == before.keys()
    for path in before:
        assert after[path].dtype == before[path].dtype
        assert after[path].tobytes() == before[path].tobytes(), f"{path} changed"
    if kind == "lora":
        for path in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]:
            assert before[path].tobytes() == pretrained.get_child(path).val().numpy().tobytes()


def test_only_the_factors_require_grad(pretrained):
    t = pretrained.apply_lora(Lora(2, 4.0))
    trainable = [path for path, p in t.named_params() if p.is_require_grad()]
    assert trainable == ["fc1.weight.lora.a", "fc1.weight.lora.b", "fc2.weight.lora.a", "fc2.weight.lora.b"]


# ---------------------------------------------------------------------------------- GPU
def _cuda_available() -> bool:
    from engine.tensor.device import cuda_device_count

    return cuda_device_count() > 0


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="needs CuPy and a GPU")
def test_qlora_on_cuda_packs_like_the_cpu_and_gives_the_same_outputs(pretrained):
    gpu = Device("cuda:0")
    q = pretrained.apply_qlora(QLora(Lora(4, 8.0))).map(_Perturb())
    x, y = _data(seed=12)
    expected = q.forward(x).numpy()
    moved = q.fork(gpu)
    assert moved.devices() == [gpu]
    np.testing.assert_allclose(moved.forward(x.to_device(gpu)).numpy(), expected, rtol=1e-5, atol=1e-6)
    # packing on the GPU gives the CPU's codes and constants
    packed_here = pretrained.fork(gpu).apply_qlora(QLora(Lora(4, 8.0)))
    for name in ["codes", "absmax_q", "absmax_scale", "absmax_mean"]:
        np.testing.assert_array_equal(getattr(packed_here.fc1.weight.reparameterization.nf4, name).val().numpy(),
                                      getattr(q.fc1.weight.reparameterization.nf4, name).val().numpy())
    grads = _mse(moved, x.to_device(gpu), y.to_device(gpu)).backward()
    assert moved.fc1.weight.reparameterization.a.val().grad(grads) is not None


def test_qlora_record_holds_the_packed_base_and_no_dense_placeholder():
    from engine import nn
    from engine.module import Lora, QLora

    model = nn.LinearConfig(d_input=128, d_output=64).init().apply_qlora(QLora(Lora(4, 8.0)))
    names = model.into_record().names()
    assert "weight" not in names  # the dense placeholder is never written
    assert {"weight.lora.a", "weight.lora.b", "weight.lora.nf4.codes", "bias"} <= set(names)
    # the forward pass does not materialize the placeholder either
    model.weight.val()
    assert not model.weight.is_initialized() or model.weight.base().shape == (128, 64)


def test_preview_counts_what_attaching_gives_without_reading_a_value():
    from engine import nn
    from engine.module import Lora, ParamGroup, trainable_counts
    from engine.module.nf4 import bits_per_weight

    class Two(Module):
        def __init__(self):
            self.fc1 = nn.LinearConfig(6, 5).init()
            self.fc2 = nn.LinearConfig(5, 3).init()

    model = Two()
    lora = Lora(2, 4.0, param_group=ParamGroup.from_regex(r"^fc1\."))
    preview = lora.preview(model.named_params())
    assert [path for path, _ in preview.targets] == ["fc1.weight"]
    assert preview.added == 2 * (6 + 5)
    assert not any(p.is_initialized() for p in model.params())
    attached = trainable_counts(model.apply_lora(lora))
    assert (preview.counts.trainable, preview.counts.total) == (attached.trainable, attached.total)
    assert bits_per_weight(64, True) == pytest.approx(4.127, abs=1e-3)  # engine-notes: 4 + 8/64 + 32/(64*256)
    assert bits_per_weight(64, False) == 4.5


@pytest.mark.parametrize("dora", [False, True])
def test_the_preview_is_right_on_a_model_that_has_adapters_already(dora):
    """Issue 44: the preview said what attaching adds as if nothing were attached ("After: 1,104
    trainable" where the result had 16,976): adapters attached before keep their trainable
    factors, which are never targets; a selected weight that has one is `nested`."""
    from engine.module.summary import trainable_counts

    class Three(Module):
        def __init__(self):
            self.fc1 = nn.LinearConfig(6, 5).init()
            self.fc2 = nn.LinearConfig(5, 4).init()
            self.fc3 = nn.LinearConfig(4, 3).init()

    first = Three().apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(r"^fc1\.")))
    second = Lora(3, 4.0, param_group=ParamGroup.from_regex(r"^fc2\."), use_dora=dora)
    attached = trainable_counts(first.apply_lora(second))
    for model in (first.named_params(), first):  # its parameter list, or the module
        preview = second.preview(model)
        assert [path for path, _ in preview.targets] == ["fc2.weight"]
        assert preview.added == 3 * (5 + 4) + (4 if dora else 0)  # DoRA: a magnitude per output column
        assert (preview.counts.trainable, preview.counts.total) == (attached.trainable, attached.total)
        assert preview.counts.trainable == 2 * (6 + 5) + preview.added  # fc1's factors stay trainable
    everything = Lora(2, 4.0, use_dora=dora).preview(first)
    # fc1's factors (fc1.weight.lora.a / .b) are not targets; fc1.weight itself already has LoRA
    assert [path for path, _ in everything.targets] == ["fc2.weight", "fc3.weight"]
    assert [path for path, _ in everything.nested] == ["fc1.weight"]
    with pytest.raises(ReparameterizationError, match="fc1.weight"):
        first.apply_lora(Lora(2, 4.0, use_dora=dora))
