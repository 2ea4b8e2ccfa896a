"""Symbolic shape inference against the real forward pass.

Random designs (seeded): every layer kind of the catalog, 2 to 5 named axes, sometimes a
structural node after the layer. Each design is built and run on three different concrete sizes
of its named axes; the analysed dims, with the sizes substituted, must equal the real output
dims every time, the exported Python's `assert_shape` checks must hold on those inputs, and the
Rust export's `assert_shape!` patterns must evaluate to the real dims. Plus the cases the probe
inference got wrong.
"""
from __future__ import annotations

import random
import re
import types

import numpy as np
import pytest

from engine import Tensor
from engine.design import Design, analyze, build_model
from engine.interop import export_python, export_rust
from engine.design.catalog import catalog
from engine.shapes.dims import Dim, as_dim
from engine.interop.export_common import ExportError
from engine.nn.spec import spec_of

N_DESIGNS = 600  # about 7.7 designs a layer kind (78 kinds): enough with a constraint to break
NAMES = ["batch", "seq", "h", "w", "d", "t", "n", "k"]
ACTIVATIONS = ["Gelu", "GeluTanh", "Relu", "Relu6", "Selu", "Sigmoid", "Tanh", "SiLU", "HardSwish", "Mish", "Softsign",
               "LogSigmoid", "Tanhshrink", "LeakyRelu", "Elu", "Celu", "HardSigmoid", "Hardtanh", "Softplus",
               "HardShrink", "SoftShrink", "ThresholdedRelu", "GaussianNoise", "Dropout", "Identity"]
SAME_DIMS_LOSSES = ["MseLoss", "SoftMarginLoss", "HuberLoss", "KLDivLoss", "PoissonNllLoss", "SmoothL1Loss",
                    "HingeEmbeddingLoss", "BinaryCrossEntropyLoss", "MarginRankingLoss", "GaussianNLLLoss"]


# ---------------------------------------------------------------------------------- generators
class Gen:
    """One random layer: its inputs ([(dims, dtype)], each wired to the listed ports) and config."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names = list(NAMES)
        rng.shuffle(self.names)
        self.names.remove("batch")

    def axes(self, n: int) -> list[str]:
        return ["batch"] + self.names[: n - 1]


def _gen(kind: str, rng: random.Random):
    """(inputs, wiring, values): inputs [(dims, dtype)], wiring [input index per port]."""
    g = Gen(rng)
    r = rng.randint
    if kind in ACTIVATIONS:
        vals = {"prob": 0.3} if kind == "Dropout" else ({"std": 0.5} if kind == "GaussianNoise" else {})
        return [(g.axes(r(2, 5)), "float")], [0], vals
    if kind == "PRelu":
        c = rng.choice([1, 3])
        names = g.axes(r(2, 4))
        return [([names[0], c] + names[1:], "float")], [0], {"num_parameters": c}
    if kind == "GLU":
        names = g.axes(r(2, 4))
        dims = list(names) + ([6] if rng.random() < 0.5 else [])
        return [(dims, "float")], [0], {"dim": rng.randrange(-len(dims), len(dims))}
    if kind in ("Linear", "SwiGlu"):
        d_in = r(1, 6)
        return [(g.axes(r(2, 4)) + [d_in], "float")], [0], {"d_input": d_in, "d_output": r(1, 6),
                                                            "bias": rng.random() < 0.5}
    if kind in ("LayerNorm", "RmsNorm", "PositionWiseFeedForward"):
        dm = r(2, 6)
        vals = {"d_model": dm} if kind != "PositionWiseFeedForward" else {"d_model": dm, "d_ff": r(2, 8)}
        return [(g.axes(r(2, 4)) + [dm], "float")], [0], vals
    if kind in ("BatchNorm", "GroupNorm", "InstanceNorm"):
        c = rng.choice([2, 4, 6])
        names = g.axes(r(2, 4))
        vals = {"BatchNorm": {"num_features": c}, "InstanceNorm": {"num_channels": c},
                "GroupNorm": {"num_channels": c, "num_groups": rng.choice([1, 2])}}[kind]
        return [([names[0], c] + names[1:], "float")], [0], vals
    if kind == "LocalResponseNorm":
        return [(g.axes(r(3, 5)), "float")], [0], {"size": r(1, 4)}
    if kind == "Embedding":
        return [(g.axes(2), "int")], [0], {"n_embedding": r(1, 9), "d_model": r(1, 5)}
    if kind in ("CosineSimilarity", "PairwiseDistance"):
        vals = {"dim": rng.choice([0, 1, -1])} if kind == "CosineSimilarity" else {}
        return [(g.axes(2), "float")], [0, 0], vals
    if kind == "PixelShuffle":
        f = rng.choice([1, 2, 3])
        names = g.axes(3)
        c = rng.choice([f * f, 2 * f * f, "ch"])
        return [([names[0], c, names[1], names[2]], "float")], [0], {"upscale_factor": f}
    if kind == "PixelUnshuffle":
        names = g.axes(rng.choice([3, 4]))
        c = names[3] if len(names) == 4 else r(1, 3)
        return [([names[0], c, names[1], names[2]], "float")], [0], {"downscale_factor": rng.choice([1, 2, 3])}
    m = re.match(r"(Conv|ConvTranspose)([123])d$", kind)
    if m:
        n = int(m.group(2))
        names = g.axes(n + 1)
        groups = rng.choice([1, 1, 2])
        cin, cout = groups * r(1, 2), groups * r(1, 3)
        k = [r(1, 3) for _ in range(n)]
        s = [r(1, 2) for _ in range(n)]
        dl = [r(1, 2) for _ in range(n)]
        one = (lambda v: v[0]) if (n == 1 and kind == "Conv1d") or (n == 1) else (lambda v: v)
        if kind.startswith("ConvTranspose"):
            pad = [r(0, 1) for _ in range(n)]
            pad_out = [r(0, max(a, b) - 1) for a, b in zip(s, dl)]
            vals = {"channels": [cin, cout], "kernel_size": one(k), "stride": one(s), "dilation": one(dl),
                    "groups": groups, "padding": one(pad), "padding_out": one(pad_out)}
        else:
            padding = rng.choice(["Valid", "Same", [r(0, 2) for _ in range(2 * n)]])
            vals = {"kernel_size": one(k), "stride": one(s), "dilation": one(dl), "groups": groups,
                    "padding": padding}
            if kind == "Conv1d":
                vals.update(channels_in=cin, channels_out=cout)
            else:
                vals["channels"] = [cin, cout]
        return [([names[0], cin] + names[1:], "float")], [0], vals
    m = re.match(r"(MaxPool|AvgPool)([12])d$", kind)
    if m:
        n = int(m.group(2))
        names = g.axes(n + 1 + (1 if rng.random() < 0.5 else 0))
        c = names[n + 1] if len(names) > n + 1 else r(1, 3)
        k = [rng.choice([1, 2, 3]) for _ in range(n)]
        s = [rng.choice([1, 2, 3]) for _ in range(n)]
        one = (lambda v: v[0]) if n == 1 else (lambda v: v)
        padding = rng.choice(["Valid", "Same", [rng.randint(0, kk // 2) for kk in k * 2]])
        if padding == "Same":
            k = [rng.choice([1, 3]) for _ in range(n)]
        vals = {"kernel_size": one(k), ("stride" if n == 1 else "strides"): one(s), "padding": padding,
                "ceil_mode": rng.random() < 0.3}
        if kind.startswith("MaxPool"):
            vals["dilation"] = one([rng.choice([1, 1, 2]) for _ in range(n)])
        return [([names[0], c] + names[1:n + 1], "float")], [0], vals
    m = re.match(r"AdaptiveAvgPool([12])d$", kind)
    if m:
        n = int(m.group(1))
        names = g.axes(n + 1)
        size = [r(1, 4) for _ in range(n)]
        return [([names[0], 2] + names[1:], "float")], [0], {"output_size": size[0] if n == 1 else size}
    m = re.match(r"Interpolate([12])d$", kind)
    if m:
        n = int(m.group(1))
        names = g.axes(n + 1)
        mode = rng.choice(["Nearest", "NearestExact", "Linear", "Cubic"])
        if rng.random() < 0.4:
            size = [r(1, 7) for _ in range(n)]
            vals = {"output_size": size[0] if n == 1 else size, "mode": mode}
        else:
            sf = [rng.choice([0.5, 0.75, 1.5, 2.0, 3.0]) for _ in range(n)]
            vals = {"scale_factor": sf[0] if n == 1 else sf, "mode": mode}
        return [([names[0], 2] + names[1:], "float")], [0], vals
    if kind in ("Lstm", "Gru", "BiLstm", "BiGru"):
        d_in = r(1, 4)
        return [(g.axes(2) + [d_in], "float")], [0], {"d_input": d_in, "d_hidden": r(1, 4), "bias": True,
                                                       "batch_first": rng.random() < 0.5}
    if kind in ("MultiHeadAttention", "TransformerEncoder", "PositionalEncoding"):
        heads = rng.choice([1, 2])
        dm = heads * rng.choice([2, 4])
        vals = {"d_model": dm}
        if kind != "PositionalEncoding":
            vals["n_heads"] = heads
        if kind == "TransformerEncoder":
            vals.update(d_ff=r(2, 6), n_layers=1)
        return [(g.axes(2) + [dm], "float")], [0], vals
    if kind in ("GatedMlp", "SparseMoe"):
        dm = r(1, 4)
        vals = {"d_model": dm, "d_ff": r(1, 5)}
        if kind == "SparseMoe":
            n = r(1, 4)
            vals.update(n_experts=n, top_k=r(1, n))
        return [(g.axes(r(2, 3)) + [dm], "float")], [0], vals
    if kind == "TransformerDecoder":
        names = g.axes(3)
        return ([([names[0], names[1], 4], "float"), ([names[0], names[2], 4], "float")], [0, 1],
                {"d_model": 4, "d_ff": 6, "n_heads": 2, "n_layers": 1})
    if kind == "RotaryEncoding":
        dm = rng.choice([2, 4])
        return [(g.axes(r(2, 4)) + [dm], "float")], [0], {"d_model": dm, "max_sequence_length": 12}
    if kind in SAME_DIMS_LOSSES:
        ports = len(catalog()[kind].inputs)
        vals = {"delta": 1.0} if kind == "HuberLoss" else {}
        return [(g.axes(r(2, 4)), "float")], [0] * ports, vals
    if kind in ("CrossEntropyLoss", "MultiMarginLoss"):
        names = g.axes(2)
        return [(names, "float"), ([names[0]], "int")], [0, 1], {}
    if kind == "CosineEmbeddingLoss":
        names = g.axes(2)
        return [(names, "float"), ([names[0]], "float")], [0, 0, 1], {}
    if kind == "TripletMarginLoss":
        return [(g.axes(2), "float")], [0, 0, 0], {}
    raise AssertionError(f"no generator for {kind}: add one (every catalog kind is tested)")


def _layer_kinds() -> list[str]:
    return sorted(k for k, s in catalog().items() if not s.structural)


def _design(kind: str, rng: random.Random) -> Design | None:
    inputs, wiring, vals = _gen(kind, rng)
    d = Design("Rand")
    for i, (dims, dtype) in enumerate(inputs):
        d.add_node("Input", f"x{i}", {"shape": dims, "dtype": dtype})
    d.add_node(kind, "layer", vals)
    for port, src in zip(d.input_ports("layer"), wiring):
        d.connect(f"x{src}", "output", "layer", port)
    last = "layer"
    a = analyze(d)
    if a.errors():
        return None
    out = a.state("layer").outputs["output"]
    extra = rng.random()
    if extra < 0.15 and out.rank >= 2:
        d.add_node("Flatten", "post", {"start_dim": rng.randrange(out.rank - 1), "end_dim": -1})
    elif extra < 0.3:
        d.add_node("Add", "post")
        d.connect(last, "output", "post", "in1")
        d.connect(last, "output", "post", "in0")
    elif extra < 0.45:
        d.add_node("Concat", "post", {"dim": rng.randrange(out.rank)})
        d.connect(last, "output", "post", "in1")
        d.connect(last, "output", "post", "in0")
    elif extra < 0.6 and out.rank >= 2 and out.dims[0] == "batch":
        d.add_node("Reshape", "post", {"shape": ["batch", -1]})
    elif extra < 0.7 and any(isinstance(x, int) and x >= 2 for x in out.dims):
        ax = next(i for i, x in enumerate(out.dims) if isinstance(x, int) and x >= 2)
        d.add_node("Split", "post", {"dim": ax, "sizes": [1, out.dims[ax] - 1]})
    if "post" in d:
        if d.kind("post") not in ("Add", "Concat"):
            d.connect(last, "output", "post", "input")
        last = "post"
    ports = d.output_ports(last)
    d.add_node("Output", "out")
    d.connect(last, ports[-1], "out", "input")
    return d if analyze(d).ok else None


def _sizes(a, names: list[str], rng: random.Random, taken: list) -> dict | None:
    constraints = [c for s in a.nodes.values() for c in s.constraints]
    for _ in range(400):
        env = {n: rng.randint(1, 3) if n == "batch" else rng.randint(1, 11) for n in names}
        if env not in taken and all(c.holds(env) for c in constraints):
            return env
    return None


def _violating(a, names: list[str], rng: random.Random) -> dict | None:
    constraints = [c for s in a.nodes.values() for c in s.constraints]
    if not constraints:
        return None
    for _ in range(200):
        env = {n: rng.randint(1, 3) if n == "batch" else rng.randint(1, 11) for n in names}
        if not all(c.holds(env) for c in constraints):
            return env
    return None


def _tensor(dims, dtype):
    if dtype == "int":
        return Tensor.from_data(np.zeros(dims, dtype=np.int64))
    return Tensor.from_data(np.full(dims, 0.5, dtype=np.float32))


def _load(source: str):
    mod = types.ModuleType("exported_random_design")
    exec(compile(source, "<exported>", "exec"), mod.__dict__)  # noqa: S102 - our own generated code
    return mod


def _rust_checks(rust: str) -> tuple[list, list]:
    """The `let [..] = x.dims();` bindings and the output `assert_shape!` patterns of a Rust export."""
    bindings = re.findall(r"let \[([^\]]*)\] = (\w+)\.dims\(\);", rust)
    patterns = re.findall(r"assert_shape!\((\w+), \[([^\]]*)\]\);", rust)
    return bindings, patterns


def _eval_rust(expr: str, env: dict) -> int:
    assert re.fullmatch(r"[A-Za-z_0-9 +\-*/()]+", expr), expr
    return eval(expr.replace("/", "//"), {"__builtins__": {}}, dict(env))  # noqa: S307 - checked above


def test_every_catalog_layer_kind_has_a_shape_rule():
    missing = [k for k, s in catalog().items()
               if not s.structural and not any(spec_of(c).shape for c in s.module_class.__mro__)]
    assert missing == []


def test_random_designs_match_the_real_forward_pass():
    rng = random.Random(18)
    kinds = _layer_kinds()
    done: dict[str, int] = {}
    rust_checked = violated = 0
    named_counts = set()
    attempts = 0
    while sum(done.values()) < N_DESIGNS:
        attempts += 1
        assert attempts < 20 * N_DESIGNS, "the generators rarely make a valid design"
        kind = min(kinds, key=lambda k: (done.get(k, 0), rng.random()))
        d = _design(kind, rng)
        if d is None:
            done.setdefault(kind, 0)
            if attempts > 5 * N_DESIGNS and done[kind] == 0:
                pytest.fail(f"no valid random design for {kind}")
            continue
        a = analyze(d)
        names = sorted({x for n in d.inputs() for x in d.config(n)["shape"] if isinstance(x, str)})
        assert 2 <= len(names) <= 5, (kind, names)
        named_counts.add(len(names))
        envs: list = []
        for _ in range(3):
            env = _sizes(a, names, rng, envs)
            if env is None:
                break
            envs.append(env)
        if len(envs) < 3:
            continue
        model = build_model(d, analysis=a).valid()
        exported = _load(export_python(d, a)).build().valid()
        try:
            rust = export_rust(d, a)
        except ExportError:
            rust = None
        want = a.output_shapes()["out"]
        for env in envs:
            xs = [_tensor([env[x] if isinstance(x, str) else x for x in d.config(n)["shape"]],
                          d.config(n)["dtype"]) for n in d.inputs()]
            y = model.forward(*xs)
            real = tuple(y.shape)
            assert want.evaluate(env) == real, (kind, d.to_dict(), env, want.text(), real)
            assert want.dtype == y.kind, (kind, want.dtype, y.kind)
            # the exported module's assert_shape calls run on the same inputs and must hold
            assert tuple(exported.forward(*xs).shape) == real, (kind, env)
            if rust is not None:
                bindings, patterns = _rust_checks(rust)
                bound = {}
                for names_text, var in bindings:
                    src = next(n for n in d.inputs() if n == var)
                    shape = [env[x] if isinstance(x, str) else x for x in d.config(src)["shape"]]
                    for nm, v in zip([p.strip() for p in names_text.split(",")], shape):
                        if nm != "_":
                            bound[nm] = v
                out_pattern = patterns[-1][1]
                parts = [p.strip() for p in out_pattern.split(",")]
                assert len(parts) == len(real), (rust, real)
                for p, v in zip(parts, real):
                    if p != "_":
                        assert _eval_rust(p, bound) == v, (kind, out_pattern, env, real)
        if rust is not None:
            rust_checked += 1
        # sizes that break a constraint are refused by the real layers too (no constraint is spurious)
        bad_env = _violating(a, names, rng)
        if bad_env is not None:
            xs = [_tensor([bad_env[x] if isinstance(x, str) else x for x in d.config(n)["shape"]],
                          d.config(n)["dtype"]) for n in d.inputs()]
            with pytest.raises(Exception):  # noqa: B017, PT011 - the layer's own error, whatever it is
                model.forward(*xs)
            violated += 1
        done[kind] = done.get(kind, 0) + 1
    assert set(done) == set(kinds) and min(done.values()) >= 3, done
    assert named_counts == {2, 3, 4, 5}
    assert rust_checked >= 150, rust_checked
    assert violated >= 50, violated


# ---------------------------------------------------------------------------------- regressions
def _one_layer(shape, kind, values, dtype="float") -> Design:
    d = Design("One")
    d.add_node("Input", "x", {"shape": shape, "dtype": dtype})
    d.add_node(kind, "layer", values)
    d.add_node("Output", "out")
    d.connect("x", "output", "layer", d.input_ports("layer")[0])
    d.connect("layer", "output", "out", "input")
    return d


def _check_exports_on(d: Design, x_shape) -> tuple:
    a = analyze(d)
    x = _tensor(x_shape, "float")
    real = tuple(build_model(d).valid().forward(x).shape)
    assert tuple(_load(export_python(d)).build().valid().forward(x).shape) == real
    return a, real


def test_conv3d_keeps_each_spatial_axis_its_own_name():
    d = _one_layer(["batch", 1, "d", "h", "w"], "Conv3d", {"channels": [1, 4], "kernel_size": [3, 3, 3]})
    a, real = _check_exports_on(d, (2, 1, 9, 11, 13))
    assert a.state("layer").outputs["output"].dims == ("batch", 4, "d-2", "h-2", "w-2")
    assert real == (2, 4, 7, 9, 11)
    rust = export_rust(d)
    assert "assert_shape!(layer, [batch, 4, d - 2, h - 2, w - 2]);" in rust


def test_max_pool_with_stride_one_keeps_w():
    d = _one_layer(["batch", "c", "h", "w"], "MaxPool2d", {"kernel_size": [3, 3], "strides": [1, 1]})
    a, real = _check_exports_on(d, (2, 3, 9, 27))
    assert a.state("layer").outputs["output"].dims == ("batch", "c", "h-2", "w-2")
    assert real == (2, 3, 7, 25)
    assert "assert_shape(layer, [batch, c, h - 2, w - 2])" in export_python(d)
    assert a.constraints() == {"layer": ["h must be at least 3", "w must be at least 3"]}


def test_strided_pool_is_a_floor_quotient():
    d = _one_layer(["batch", "c", "h", "w"], "MaxPool2d", {"kernel_size": [3, 3], "strides": [2, 2]})
    a, real = _check_exports_on(d, (1, 2, 10, 7))
    t = a.state("layer").outputs["output"]
    assert t.dims == ("batch", "c", "(h-1)//2", "(w-1)//2") and t.evaluate({"batch": 1, "c": 2, "h": 10,
                                                                            "w": 7}) == real
    assert "assert_shape!(layer, [batch, c, (h - 1) / 2, (w - 1) / 2]);" in export_rust(d)


def test_pixel_unshuffle_divisibility_is_a_constraint_in_the_users_names():
    d = _one_layer(["batch", 1, "h", "w"], "PixelUnshuffle", {"downscale_factor": 2})
    a = analyze(d)
    assert a.ok, a.messages()
    assert a.state("layer").outputs["output"].dims == ("batch", 4, "h//2", "w//2")
    assert a.constraints() == {"layer": ["h must be even", "w must be even"]}
    d3 = _one_layer(["batch", 1, "h", "w"], "PixelUnshuffle", {"downscale_factor": 3})
    assert analyze(d3).constraints() == {"layer": ["h must be divisible by 3", "w must be divisible by 3"]}
    _check_exports_on(d, (2, 1, 6, 8))
    # a fixed size that cannot be divided is an error, with the layer's own message
    bad = _one_layer(["batch", 1, "h", 11], "PixelUnshuffle", {"downscale_factor": 2})
    assert analyze(bad).errors() == {"layer": "PixelUnshuffle: input width (11) must be divisible by "
                                              "downscale_factor (2)"}


def test_glu_on_an_odd_axis_is_refused_and_a_named_one_must_be_even():
    named = _one_layer(["batch", "seq"], "GLU", {"dim": 1})
    a = analyze(named)
    assert a.state("layer").outputs["output"].dims == ("batch", "seq//2")
    assert a.constraints() == {"layer": ["seq must be even"]}
    _check_exports_on(named, (2, 6))
    odd = _one_layer(["batch", 7], "GLU", {"dim": 1})
    assert analyze(odd).errors() == {"layer": "GLU: input tensor along dimension 1 must have an even size, got 7 "
                                              "(dims [batch, 7])"}
    even = _one_layer(["batch", "seq", 6], "GLU", {"dim": -1})
    a = analyze(even)
    assert a.state("layer").outputs["output"].dims == ("batch", "seq", 3) and not a.constraints()


def test_dims_are_canonical_and_exact():
    h, w = Dim.name("h"), Dim.name("w")
    assert (h - 2) // 2 + 1 == h // 2
    assert (2 * h) // 2 == h and (2 * h + 3) // 2 == h + 1
    assert str(h.ceil_div(2)) == "(h+1)//2" and str((h - 3) // 2 + 1) == "(h-1)//2"
    assert h * w == w * h and str(16 * h * w) == "16*h*w"
    e = ((h - 5) // 3 + 1) * w - 1
    for hv in range(5, 30):
        for wv in range(1, 5):
            assert e.evaluate({"h": hv, "w": wv}) == ((hv - 5) // 3 + 1) * wv - 1
    assert as_dim(4) == 4 and as_dim("h") == h


def test_one_dimensional_pool_and_conv_rules_hold_for_every_small_length():
    """Every stride / kernel / dilation / padding / ceil_mode combination of small 1-D pools and
    convolutions, on every length from 1 to 14: the rule's size (with its constraints) is the
    real one, and a length the constraints refuse is refused by the layer too."""
    import itertools

    from engine import nn
    from engine.nn.spec import infer
    from engine.shapes.rules import RuleError, Shape

    x_dim = Dim.name("L")
    checked = 0
    for k, s, d, ceil, pad in itertools.product((1, 2, 3), (1, 2, 3), (1, 2), (False, True),
                                                ("Valid", "Same", (1, 0), (1, 1))):
        if pad == "Same" and k % 2 == 0:
            continue
        padding = nn.PaddingConfig1d.of(pad) if isinstance(pad, str) else nn.PaddingConfig1d.Explicit(*pad)
        layers = [nn.MaxPool1dConfig(k, s, padding, d, ceil).init()]
        if not ceil:
            layers.append(nn.Conv1dConfig(1, 1, k, stride=s, dilation=d, padding=padding).init())
        for layer in layers:
            try:
                result = infer(layer, [Shape((as_dim(1), as_dim(1), x_dim))])
            except RuleError as e:
                if "has no exact shape rule" in str(e):  # the one corner without a rule
                    assert isinstance(layer, nn.Conv1d) and pad == "Same" and k < s and d * (k - 1) + 1 > k
                    continue
                for L in range(1, 15):  # a refusal whatever the length: the layer refuses too
                    with pytest.raises(Exception):  # noqa: B017, PT011
                        layer.forward(Tensor.zeros((1, 1, L)))
                continue
            for L in range(1, 15):
                env = {"L": L}
                x = Tensor.zeros((1, 1, L))
                try:
                    real = tuple(layer.forward(x).shape)
                except Exception:  # noqa: BLE001 - a length the layer refuses
                    real = None
                fits = all(c.holds(env) for c in result.constraints)
                if real is None:
                    assert not fits, (layer, L, [c.text() for c in result.constraints])
                    continue
                assert fits, (layer, L)
                assert tuple(dd.evaluate(env) for dd in result.shape.dims) == real, (layer, pad, L)
                checked += 1
    assert checked > 1500


def test_rules_read_no_parameter_values():
    """A rule reads settings and parameter shapes only: every lazy parameter stays uninitialized
    (what a shape-only check of a whole model needs)."""
    from engine.nn.spec import infer
    from engine.shapes.rules import Shape

    rng = random.Random(7)
    seen = 0
    for kind in _layer_kinds():
        for _ in range(20):
            inputs, wiring, vals = _gen(kind, rng)
            spec = catalog()[kind]
            try:
                module = spec.create(spec.check_values(vals))
            except Exception:  # noqa: BLE001 - a config the layer refuses: try another
                continue
            shapes = [Shape(tuple(as_dim(x) for x in inputs[i][0]), inputs[i][1]) for i in wiring]
            try:
                infer(module, shapes)
            except Exception:  # noqa: BLE001 - an input the rule refuses is fine here
                pass
            params = [p for _, p in module.named_params()]
            assert not any(p.is_initialized() for p in params), kind
            seen += len(params)
            break
    assert seen > 50
