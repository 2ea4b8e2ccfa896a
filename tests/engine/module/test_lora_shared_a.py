"""A LoRA `a` factor shared by the parts of a fused module (engine.module.lora's "Shared A factors"): a model
whose `lora_shared_a()` names weights that share one gets ONE `a` parameter for them (the same `Param`: one id,
its gradient the sum over the parts, one optimizer state, saved once, counted once) and a `b` per part."""
import numpy as np

from engine import Device, Tensor, nn, optim
from engine.module import Module, ModuleMapper
from engine.module.lora import Lora
from engine.module.summary import ModelStats, trainable_counts
from engine.store import ModuleRecord

D_IN, D_Q, D_K, RANK = 5, 4, 3, 2


class Fused(Module):
    """Two projections of one input, stored elsewhere as one fused module (as Phi-3's q / k of qkv_proj)."""

    def __init__(self, device=None):
        self.q = nn.LinearConfig(D_IN, D_Q, bias=False).init(device)
        self.k = nn.LinearConfig(D_IN, D_K, bias=False).init(device)
        self.out = nn.LinearConfig(D_IN, 2, bias=False).init(device)

    def forward(self, x):
        return self.q.forward(x).tanh().sum_dim(1) * self.k.forward(x).sum_dim(1) + self.out.forward(x)


class TiedFused(Fused):
    def lora_shared_a(self):
        return {"q.weight": "qk", "k.weight": "qk"}


class _Noise(ModuleMapper):
    """Seeded values for every `b` (zero at first: the gradients of `a` would be zero)."""

    def __init__(self):
        self.path, self.rng = [], np.random.default_rng(3)

    def enter_module(self, name, container_type):
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()

    def map_float(self, param):
        if self.path[-1] != "b":
            return param
        return param.map(lambda t: Tensor.from_data(self.rng.standard_normal(t.shape).astype(np.float32),
                                                     device=t.device).autodiff().set_require_grad(True))


class _SetAt(ModuleMapper):
    """The parameter at `path` holds `values` (its id kept)."""

    def __init__(self, path, values):
        self.at, self.values, self.path = path, values, []

    def enter_module(self, name, container_type):
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()

    def map_float(self, param):
        if ".".join(self.path) != self.at:
            return param
        return param.map(lambda t: Tensor.from_data(self.values, device=t.device))


def _tied(seed=0):
    Device("cpu").seed(seed)
    return TiedFused().apply_lora(Lora(RANK, 4.0)).map(_Noise())


def _x():
    return Tensor.from_data(np.random.default_rng(1).standard_normal((6, D_IN)).astype(np.float32))


def test_the_parts_share_one_a_parameter_and_keep_their_own_b():
    model = _tied()
    q, k = model.q.weight.reparameterization, model.k.weight.reparameterization
    assert q.a is k.a and q.a.id == k.a.id
    assert q.b.id != k.b.id and q.b.shape == (RANK, D_Q) and k.b.shape == (RANK, D_K)
    assert model.out.weight.reparameterization.a.id != q.a.id  # not named by lora_shared_a: its own
    # listed, counted and saved once, at its first path
    paths = [p for p, _ in model.named_params()]
    assert "q.weight.lora.a" in paths and "k.weight.lora.a" not in paths and "k.weight.lora.b" in paths
    added = D_IN * RANK + RANK * D_Q + RANK * D_K + D_IN * RANK + RANK * 2
    assert trainable_counts(model).trainable == added
    stats = ModelStats(model)
    assert stats.shared == {"k.weight.lora.a": "q.weight.lora.a"}
    assert stats.get("k.weight.lora.a").numel == 0 and stats.get("q.weight.lora.a").numel == D_IN * RANK
    assert Lora(RANK, 4.0).bound_to(TiedFused()).preview(TiedFused()).added == added
    assert Lora(RANK, 4.0).preview(TiedFused()).added == added  # unbound (the LoRA dialog's): bound by the preview
    names = model.into_record().names()
    assert "q.weight.lora.a" in names and "k.weight.lora.a" not in names
    # a model without lora_shared_a gets an `a` per part
    Device("cpu").seed(0)
    untied = Fused().apply_lora(Lora(RANK, 4.0))
    assert untied.q.weight.reparameterization.a.id != untied.k.weight.reparameterization.a.id
    assert trainable_counts(untied).trainable == added + D_IN * RANK


def test_the_shared_a_gradient_is_the_sum_over_the_parts():
    model = _tied().train()
    grads = optim.GradientsParams.from_grads(model.forward(_x()).sum().backward(), model)
    a = model.q.weight.reparameterization.a
    tied = grads.get(a.id).numpy()
    # the same values as two separate parameters (q's `a` copied to k's): their gradients summed
    Device("cpu").seed(0)
    twin = Fused().apply_lora(Lora(RANK, 4.0)).valid()
    record = ModuleRecord.from_bytes(model.valid().into_record().to_bytes())
    twin = twin.load_record(record.allow_partial(True))
    twin = twin.map(_SetAt("k.weight.lora.a", a.val().numpy())).train()  # its own id, q's values
    values, copies = dict(model.named_params()), dict(twin.named_params())
    for path in values:
        assert np.array_equal(copies[path].val().numpy(), values[path].val().numpy()), path
    assert np.array_equal(copies["k.weight.lora.a"].val().numpy(), a.val().numpy())
    g = optim.GradientsParams.from_grads(twin.forward(_x()).sum().backward(), twin)
    parts = [g.get(twin.q.weight.reparameterization.a.id).numpy(), g.get(twin.k.weight.reparameterization.a.id).numpy()]
    assert np.abs(parts[0]).max() > 1e-3 and np.abs(parts[1]).max() > 1e-3
    np.testing.assert_allclose(tied, parts[0] + parts[1], rtol=1e-5, atol=1e-6)


def test_one_optimizer_state_and_every_place_stepped_alike():
    model = _tied().train()
    opt = optim.AdamWConfig(weight_decay=0.01).init()
    before = model.q.weight.reparameterization.a.val().numpy()
    for _ in range(3):
        grads = optim.GradientsParams.from_grads(model.forward(_x()).sum().backward(), model)
        model = opt.step(0.01, model, grads)
    q, k = model.q.weight.reparameterization, model.k.weight.reparameterization
    assert q.a is k.a  # the step rebuilt both places with the one stepped parameter
    assert np.abs(q.a.val().numpy() - before).max() > 1e-3
    assert len(opt.states) == 5  # a (shared), the two parts' b, out's a and b
    record = opt.to_record()
    assert len({pid for _, _, pid in record.tensors}) == 5
    # moved, cloned, frozen and reloaded, the places still hold one parameter
    for m in (model.clone(), model.valid(), model.freeze(), model.no_grad(),
              _tied(seed=5).load_record(ModuleRecord.from_bytes(model.valid().into_record().to_bytes()))):
        assert m.q.weight.reparameterization.a is m.k.weight.reparameterization.a
    loaded = _tied(seed=5).load_record(ModuleRecord.from_bytes(model.valid().into_record().to_bytes()))
    assert np.array_equal(loaded.k.weight.reparameterization.a.val().numpy(), q.a.val().numpy())


def test_the_memory_estimate_counts_a_shared_a_once():
    from engine.module import memory

    lora = Lora(RANK, 4.0)
    for model in (TiedFused(), Fused()):
        adapted = model.apply_lora(lora)
        # the bytes of the factors made, each parameter once (the tied `a` is one Param at two places)
        made = sum(p.numel() * p.base().dtype.itemsize for path, p in adapted.named_params() if ".lora." in path)
        assert memory.estimate_lora(model, lora).parts["LoRA factors"] == made
    # the shared `a` is D_IN x RANK float32 fewer than three separate adapters' factors
    assert (memory.estimate_lora(Fused(), lora).parts["LoRA factors"]
            - memory.estimate_lora(TiedFused(), lora).parts["LoRA factors"]) == D_IN * RANK * 4
