"""Real checkpoints written by other tools: Burn's own MNIST burnpack and a PyTorch
state_dict in safetensors, each loaded into the engine's equivalent model."""
import numpy as np
import pytest

from engine import Tensor, nn
from engine.module import Module
from engine.store import ModuleRecord, RecordError

# ---------------------------------------------------------------------------------- burn-mnist


class ConvBlock(Module):
    """conv -> norm -> relu -> pool, as the fixture's README describes (Burn's names)."""

    def __init__(self, channels):
        self.conv = nn.Conv2dConfig(channels, (3, 3)).init()
        self.norm = nn.BatchNormConfig(channels[1]).init()
        self.pool = nn.MaxPool2dConfig((2, 2), strides=(2, 2)).init()
        self.activation = nn.Relu()

    def forward(self, x):
        return self.pool.forward(self.activation.forward(self.norm.forward(self.conv.forward(x))))


class MnistModel(Module):
    def __init__(self):
        self.conv1 = ConvBlock((1, 64))
        self.conv2 = ConvBlock((64, 64))
        self.dropout = nn.DropoutConfig(0.25).init()
        self.fc1 = nn.LinearConfig(1600, 128).init()
        self.fc2 = nn.LinearConfig(128, 128).init()
        self.fc3 = nn.LinearConfig(128, 10).init()
        self.activation = nn.Gelu()

    def forward(self, x):
        b = x.shape[0]
        x = self.conv2.forward(self.conv1.forward(x.reshape((b, 1, 28, 28)))).reshape((b, 1600))
        x = self.dropout.forward(self.activation.forward(self.fc1.forward(x)))
        x = self.dropout.forward(self.activation.forward(self.fc2.forward(x)))
        return self.fc3.forward(x)


def _render(polylines, width=2.6):
    """Anti-aliased strokes on a 28x28 grid (pixel centres at +0.5), white on black."""
    yy, xx = np.mgrid[0:28, 0:28] + 0.5
    img = np.zeros((28, 28))
    for pts in polylines:
        pts = np.asarray(pts, float)
        for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:]):
            dx, dy = x1 - x0, y1 - y0
            t = np.clip(((xx - x0) * dx + (yy - y0) * dy) / max(dx * dx + dy * dy, 1e-12), 0, 1)
            d = np.hypot(xx - (x0 + t * dx), yy - (y0 + t * dy))
            img = np.maximum(img, np.clip(width / 2 + 0.5 - d, 0, 1))
    return img


def _arc(cx, cy, rx, ry, a0, a1, n=32):
    a = np.radians(np.linspace(a0, a1, n))
    return np.stack([cx + rx * np.cos(a), cy - ry * np.sin(a)], 1)


# Hand-drawn digits in MNIST's framing (about 20 pixels tall, centred), one stroke set each.
DIGITS = {
    0: [_arc(14, 14, 5.5, 8.5, 0, 360)],
    1: [[(14, 5), (14, 23)]],
    2: [np.concatenate([_arc(14, 9.5, 5, 4.5, 160, -30), [(8.5, 23), (19.5, 23)]])],
    3: [_arc(13.5, 9.5, 5, 4.3, 150, -90), _arc(13.5, 18.5, 5.5, 4.7, 90, -150)],
    4: [[(17, 23), (17, 5), (8, 17), (20, 17)]],
    5: [[(19, 5), (9.5, 5), (9, 13)], _arc(13.5, 17.5, 5.5, 5.5, 140, -140)],
    6: [_arc(14, 18, 5, 5, 0, 360), [(9, 18), (15, 5)]],
    7: [[(8, 5), (20, 5), (12, 23)]],
    8: [_arc(14, 9.5, 4.3, 4.3, 0, 360), _arc(14, 18.5, 5.2, 4.7, 0, 360)],
    9: [_arc(14, 10, 5, 5, 0, 360), [(19, 10), (15, 23)]],
}


def _digit_batch() -> Tensor:
    images = np.stack([_render(DIGITS[d]) for d in range(10)])  # pixel / 255 in [0, 1]
    return Tensor.from_data(((images - 0.1307) / 0.3081).astype(np.float32))


@pytest.fixture
def mnist_path(fixtures_dir):
    return fixtures_dir / "burn-mnist.bpk"


def test_burn_mnist_classifies_hand_drawn_digits(mnist_path):
    record = ModuleRecord.load(mnist_path)
    fresh = MnistModel()
    model = fresh.load_record(record).valid()
    logits = model.forward(_digit_batch()).numpy()
    assert logits.shape == (10, 10)
    # every digit 0-9, drawn here from strokes (not MNIST data), is recognized by the trained
    # network, and with confidence: what a wrongly loaded tensor (a missed transpose, gamma and
    # beta swapped, running statistics left at 0/1) would not give
    assert logits.argmax(1).tolist() == list(range(10))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert (p.max(1) > 0.9).all(), p.max(1)
    # the same architecture with its own random initialization does not
    untrained = fresh.valid().forward(_digit_batch()).numpy().argmax(1)
    assert (untrained == np.arange(10)).sum() <= 5


def test_burn_mnist_saved_again_is_the_same_file(mnist_path, tmp_path):
    model = MnistModel().load_record(ModuleRecord.load(mnist_path))
    out = model.into_record().save(tmp_path / "again")
    assert out.name == "again.bpk"
    assert out.read_bytes() == mnist_path.read_bytes()
    # the ids came from the file, not from the fresh model
    ids = {path: int(p.id) for path, p in model.named_params()}
    assert ids == {e.name: e.param_id for e in ModuleRecord.load(mnist_path).entries()}


def test_burn_mnist_loads_into_the_shipped_example(mnist_path):
    from resources.examples import build_example

    model = build_example("digits").load_record(ModuleRecord.load(mnist_path)).valid()
    assert model.forward(_digit_batch()).numpy().argmax(1).tolist() == list(range(10))


def test_burn_mnist_into_a_wrong_architecture_is_refused(mnist_path):
    class Narrow(MnistModel):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.LinearConfig(1600, 64).init()
            self.fc2 = nn.LinearConfig(64, 128).init()

    with pytest.raises(RecordError) as info:
        Narrow().load_record(ModuleRecord.load(mnist_path))
    assert info.value.mismatched == [("fc1.weight", (1600, 64), (1600, 128)), ("fc1.bias", (64,), (128,)),
                                     ("fc2.weight", (64, 128), (128, 128))]


# ---------------------------------------------------------------------------------- PyTorch


class TorchNet(Module):
    """conv1 -> norm1 (inference) -> relu -> flatten -> fc1, in the engine's names."""

    def __init__(self):
        self.conv1 = nn.Conv2dConfig((3, 4), (3, 3), padding=nn.PaddingConfig2d.Explicit(1, 1, 1, 1)).init()
        self.norm1 = nn.BatchNormConfig(4).init()
        self.fc1 = nn.LinearConfig(4 * 8 * 8, 16).init()
        self.relu = nn.Relu()

    def forward(self, x):
        x = self.relu.forward(self.norm1.forward(self.conv1.forward(x)))
        return self.fc1.forward(x.flatten(1, 3))


# From Burn's own test of this file: tracel-ai/burn,
# crates/burn-store/safetensors-tests/tests/multi_layer/mod.rs, `multi_layer_model`
# (input: ones [1, 3, 8, 8], PyTorchToBurnAdapter, Tolerance::default()).
BURN_EXPECTED = [
    0.04971555, -0.16849735, 0.05182848, -0.18032673, 0.23138367, 0.05041867, 0.13005908, -0.32202929,
    -0.07915690, -0.03232457, -0.19790289, -0.17476529, -0.19627589, -0.21757686, -0.31376451, 0.08377837,
]


def test_torch_multi_layer_matches_burns_reference(fixtures_dir):
    path = fixtures_dir / "torch-multi-layer.safetensors"
    record = ModuleRecord.load(path, adapter="pytorch")
    assert "norm1.num_batches_tracked" not in record  # dropped, so it is not "unused"
    model = TorchNet().load_record(record).valid()
    out = model.forward(Tensor.ones((1, 3, 8, 8))).numpy()
    np.testing.assert_allclose(out, [BURN_EXPECTED], rtol=1e-4, atol=1e-5)
    params = dict(model.named_params())
    import safetensors.numpy as stn

    raw = stn.load_file(str(path))
    np.testing.assert_array_equal(params["fc1.weight"].val().numpy(), raw["fc1.weight"].T)
    np.testing.assert_array_equal(params["norm1.gamma"].val().numpy(), raw["norm1.weight"])
    np.testing.assert_array_equal(params["norm1.running_var"].val().numpy(), raw["norm1.running_var"])


def test_torch_multi_layer_without_the_adapter_reports_every_difference(fixtures_dir):
    record = ModuleRecord.load(fixtures_dir / "torch-multi-layer.safetensors")
    with pytest.raises(RecordError) as info:
        TorchNet().load_record(record)
    err = info.value
    assert [p for p, _ in err.missing] == ["norm1.gamma", "norm1.beta"]
    assert sorted(p for p, _ in err.unused) == ["norm1.bias", "norm1.num_batches_tracked", "norm1.weight"]
    assert err.mismatched == [("fc1.weight", (256, 16), (16, 256))]


def test_torch_multi_layer_round_trips_through_the_adapter(fixtures_dir, tmp_path):
    import safetensors.numpy as stn

    src = fixtures_dir / "torch-multi-layer.safetensors"
    model = TorchNet().load_record(ModuleRecord.load(src, adapter="pytorch"))
    out = model.into_record().save(tmp_path / "again.safetensors", adapter="pytorch")
    a, b = stn.load_file(str(src)), stn.load_file(str(out))
    assert sorted(a) == sorted(b)
    for k in a:
        if k != "norm1.num_batches_tracked":  # Burn keeps no step counter: written as 0
            np.testing.assert_array_equal(a[k], b[k])
