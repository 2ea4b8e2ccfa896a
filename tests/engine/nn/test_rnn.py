"""Lstm, BiLstm, Gru, BiGru: values against a NumPy loop and Burn's (PyTorch-derived) numbers,
gradients against finite differences."""
import numpy as np
import pytest

from engine import Tensor, nn
from engine.module.param import Param
from tests.engine.gradcheck import check_grads

RNG = np.random.default_rng(21)


def sig(v):
    return 1 / (1 + np.exp(-v))


def _w(gate):
    it, ht = gate.input_transform, gate.hidden_transform
    return (it.weight.val().numpy(), it.bias.val().numpy(), ht.weight.val().numpy(), ht.bias.val().numpy())


def _lstm_ref(m, x, c, h, reverse=False):
    gi, gf, go, gc = (_w(g) for g in (m.input_gate, m.forget_gate, m.output_gate, m.cell_gate))
    lin = lambda g, a, b: a @ g[0] + g[1] + b @ g[2] + g[3]  # noqa: E731
    outs = [None] * x.shape[1]
    for t in (range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])):
        xt = x[:, t]
        i, f, o, g = sig(lin(gi, xt, h)), sig(lin(gf, xt, h)), sig(lin(go, xt, h)), np.tanh(lin(gc, xt, h))
        c = f * c + i * g
        h = o * np.tanh(c)
        outs[t] = h
    return np.stack(outs, 1), c, h


def test_lstm_against_numpy(dev64):
    m = nn.LstmConfig(3, 4, True).init(dev64)
    x = RNG.standard_normal((2, 5, 3))
    c0, h0 = RNG.standard_normal((2, 4)), RNG.standard_normal((2, 4))
    out, st = m.forward(Tensor.from_data(x, device=dev64), nn.LstmState(Tensor.from_data(c0, device=dev64),
                                                                        Tensor.from_data(h0, device=dev64)))
    ro, rc, rh = _lstm_ref(m, x, c0, h0)
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-10)
    np.testing.assert_allclose(st.cell.numpy(), rc, rtol=1e-10)
    np.testing.assert_allclose(st.hidden.numpy(), rh, rtol=1e-10)
    seq_first = nn.LstmConfig(3, 4, True, batch_first=False).init(dev64)
    for a in ("input_gate", "forget_gate", "output_gate", "cell_gate"):
        setattr(seq_first, a, getattr(m, a))
    out2, _ = seq_first.forward(Tensor.from_data(x.transpose(1, 0, 2), device=dev64))
    np.testing.assert_allclose(out2.numpy().transpose(1, 0, 2), _lstm_ref(m, x, 0 * c0, 0 * h0)[0], rtol=1e-10)


def test_lstm_grads(dev64):
    m = nn.LstmConfig(2, 3, True).init(dev64)
    w = m.input_gate.hidden_transform.weight.val().numpy()

    def f(xt, wt):
        m.input_gate.hidden_transform.weight = Param(wt)
        out, st = m.forward(xt)
        return out * 1.0 + st.cell.unsqueeze(1)

    check_grads(f, RNG.standard_normal((2, 3, 2)), w, device=dev64)


def test_lstm_options(dev64):
    m = nn.LstmConfig(2, 3, False, clip=0.05, input_forget=True, reverse=True).init(dev64)
    assert m.input_gate.input_transform.bias is None
    x = RNG.standard_normal((1, 4, 2)) * 3
    out, st = m.forward(Tensor.from_data(x, device=dev64))
    assert np.abs(st.cell.numpy()).max() <= 0.05 + 1e-12
    np.testing.assert_allclose(out.numpy()[:, 0], st.hidden.numpy())  # reverse: the last step is position 0


def _gate(input_w, input_b, hidden_w, hidden_b, dev):
    def lin(w, b):
        m = nn.LinearConfig(len(w), len(w[0])).init(dev)
        m.weight, m.bias = Param(Tensor.from_data(w, device=dev)), Param(Tensor.from_data(b, device=dev))
        return m

    return nn.GateController(lin(input_w, input_b), lin(hidden_w, hidden_b))


BI_INPUT = [[[0.949, -0.861], [0.892, 0.927], [-0.173, -0.301], [-0.081, 0.992]]]
H0 = [[[0.280, 0.360, -1.242]], [[-0.588, 0.729, -0.788]]]


def test_bilstm_burn_values(dev64):
    m = nn.BiLstmConfig(2, 3, True).init(dev64)
    fw, rv = m.forward_lstm, m.reverse
    fw.input_gate = _gate([[0.367, 0.091, 0.342], [0.322, 0.533, 0.059]], [-0.196, 0.354, 0.209],
                          [[-0.320, 0.232, -0.165], [0.093, -0.572, -0.315], [-0.467, 0.325, 0.046]], [0.181, -0.190, -0.245], dev64)
    fw.forget_gate = _gate([[-0.342, -0.084, -0.420], [-0.432, 0.119, 0.191]], [0.315, -0.413, -0.041],
                           [[0.453, 0.063, 0.561], [0.211, 0.149, 0.213], [-0.499, -0.158, 0.068]], [-0.431, -0.535, 0.125], dev64)
    fw.cell_gate = _gate([[-0.046, -0.382, 0.321], [-0.533, 0.558, 0.004]], [-0.358, 0.282, -0.078],
                         [[-0.358, 0.109, 0.139], [-0.345, 0.091, -0.368], [-0.508, 0.221, -0.507]], [0.502, -0.509, -0.247], dev64)
    fw.output_gate = _gate([[-0.577, -0.359, 0.216], [-0.550, 0.268, 0.243]], [-0.227, -0.274, 0.039],
                           [[-0.383, 0.449, 0.222], [-0.357, -0.093, 0.449], [-0.106, 0.236, 0.360]], [-0.361, -0.209, -0.454], dev64)
    rv.input_gate = _gate([[-0.055, 0.506, 0.247], [-0.369, 0.178, -0.258]], [0.540, -0.164, 0.033],
                          [[0.159, 0.180, -0.037], [-0.443, 0.485, -0.488], [0.098, -0.085, -0.140]], [-0.510, 0.105, 0.114], dev64)
    rv.forget_gate = _gate([[-0.154, -0.432, -0.547], [-0.369, -0.310, -0.175]], [0.141, 0.004, 0.055],
                           [[-0.005, -0.277, -0.515], [-0.011, -0.101, -0.365], [0.426, 0.379, 0.337]], [-0.382, 0.331, -0.176], dev64)
    rv.cell_gate = _gate([[-0.571, 0.228, -0.287], [-0.331, 0.110, 0.219]], [-0.206, -0.546, 0.462],
                         [[0.449, -0.240, 0.071], [-0.045, 0.131, 0.124], [0.138, -0.201, 0.191]], [-0.030, 0.211, -0.352], dev64)
    rv.output_gate = _gate([[0.491, -0.442, 0.333], [0.313, -0.121, -0.070]], [-0.387, -0.250, 0.066],
                           [[-0.030, 0.268, 0.299], [-0.019, -0.280, -0.314], [0.466, -0.365, -0.248]], [-0.398, -0.199, -0.566], dev64)
    x = Tensor.from_data(BI_INPUT, device=dev64)
    c0 = Tensor.from_data([[[0.723, 0.397, -0.262]], [[0.471, 0.613, 1.885]]], device=dev64)
    out, st = m.forward(x, nn.LstmState(c0, Tensor.from_data(H0, device=dev64)))
    np.testing.assert_allclose(out.numpy(), [[
        [0.23764, -0.03442, 0.04414, -0.15635, -0.03366, -0.05798],
        [0.00473, -0.02254, 0.02988, -0.16510, -0.00306, 0.08742],
        [0.06210, -0.06509, -0.05339, -0.01710, 0.02091, 0.16012],
        [-0.03420, 0.07774, -0.09774, -0.02604, 0.12584, 0.20872]]], atol=2e-4)
    np.testing.assert_allclose(st.cell.numpy(), [[[-0.13593, 0.17125, -0.22395]], [[-0.45425, -0.11206, -0.12908]]], atol=2e-4)
    out, st = m.forward(x)
    np.testing.assert_allclose(st.hidden.numpy(), [[[-0.04026, 0.07178, -0.10189]], [[-0.15969, -0.05322, -0.08863]]], atol=2e-4)
    assert [p for p, _ in m.named_params()][0] == "forward.input_gate.input_transform.weight"


def _gru_ref(m, x, h, reverse=False):
    gu, gr, gn = (_w(g) for g in (m.update_gate, m.reset_gate, m.new_gate))
    outs = [None] * x.shape[1]
    for t in (range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])):
        xt = x[:, t]
        z = sig(xt @ gu[0] + gu[1] + h @ gu[2] + gu[3])
        r = sig(xt @ gr[0] + gr[1] + h @ gr[2] + gr[3])
        if m.reset_after:
            n = np.tanh(xt @ gn[0] + gn[1] + r * (h @ gn[2] + gn[3]))
        else:
            n = np.tanh(xt @ gn[0] + gn[1] + (r * h) @ gn[2] + gn[3])
        h = (1 - z) * n + z * h
        outs[t] = h
    return np.stack(outs, 1), h


@pytest.mark.parametrize("reset_after", [True, False])
def test_gru_against_numpy_and_grads(dev64, reset_after):
    m = nn.GruConfig(3, 4, True, reset_after=reset_after).init(dev64)
    x = RNG.standard_normal((2, 5, 3))
    h0 = RNG.standard_normal((2, 4))
    out = m.forward(Tensor.from_data(x, device=dev64), Tensor.from_data(h0, device=dev64))
    np.testing.assert_allclose(out.numpy(), _gru_ref(m, x, h0)[0], rtol=1e-10)
    check_grads(lambda t: m.forward(t), x[:, :3], device=dev64)


def test_gru_burn_values():
    m = nn.GruConfig(1, 1, False).init()
    for name, v in (("update_gate", 0.5), ("reset_gate", 0.6), ("new_gate", 0.7)):
        g = getattr(m, name)
        g.input_transform.weight = Param(Tensor.from_data([[v]]))
        g.hidden_transform.weight = Param(Tensor.from_data([[v]]))
    out = m.forward(Tensor.from_data([[[0.1], [0.2], [0.3]]]))
    np.testing.assert_allclose(out.numpy()[0], [[0.0341], [0.0894], [0.1575]], atol=1e-4)


def test_bigru_against_numpy(dev64):
    m = nn.BiGruConfig(2, 3, True).init(dev64)
    x = RNG.standard_normal((2, 4, 2))
    h0 = RNG.standard_normal((2, 2, 3))
    out, hn = m.forward(Tensor.from_data(x, device=dev64), Tensor.from_data(h0, device=dev64))
    of, hf = _gru_ref(m.forward_gru, x, h0[0])
    orv, hr = _gru_ref(m.reverse, x, h0[1], reverse=True)
    np.testing.assert_allclose(out.numpy(), np.concatenate([of, orv], 2), rtol=1e-10)
    np.testing.assert_allclose(hn.numpy(), np.stack([hf, hr]), rtol=1e-10)
    seq_first = nn.BiGruConfig(2, 3, True, batch_first=False).init()
    o2, h2 = seq_first.forward(Tensor.zeros([4, 2, 2]))
    assert o2.shape == (4, 2, 6) and h2.shape == (2, 2, 3)
    check_grads(lambda t: m.forward(t)[0], x[:, :2], device=dev64)


def test_rnn_init_is_xavier_normal():
    m = nn.LstmConfig(64, 64, True).init()
    w = m.input_gate.input_transform.weight.val().numpy()
    assert abs(w.std() - np.sqrt(2 / 128)) < 0.01
