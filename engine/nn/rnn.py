"""Recurrent layers: Lstm, BiLstm, Gru, BiGru, with Burn's gate layout.

Every gate is a `GateController` of two linear maps, `input_transform` `[d_input, d_hidden]`
and `hidden_transform` `[d_hidden, d_hidden]` (parameter paths such as
`input_gate.input_transform.weight`), initialized with XavierNormal(gain 1) by default. The
input projections of all time steps are computed in one matrix product per gate; the
recurrence then runs step by step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..tensor import cat, stack
from ._base import Config, Layer, Module, assert_shape, check_dtype, initializers
from .activation import ActivationConfig
from .linear import LinearConfig
from ..shapes.rules import Shape, expect, float_input, with_dim
from .spec import Burn, declare

__all__ = [
    "GateController", "LstmState", "LstmConfig", "Lstm", "BiLstmConfig", "BiLstm",
    "GruConfig", "Gru", "BiGruConfig", "BiGru",
]


def _xavier_default():
    return initializers.XavierNormal(gain=1.0)


class GateController(Module):
    """One gate: `input_transform(x) + hidden_transform(h)`."""

    def __init__(self, input_transform, hidden_transform):
        super().__init__()
        self.input_transform = input_transform
        self.hidden_transform = hidden_transform

    @staticmethod
    def new(d_input: int, d_output: int, bias: bool, initializer, device=None) -> "GateController":
        return GateController(
            LinearConfig(d_input, d_output, bias, initializer).init(device),
            LinearConfig(d_output, d_output, bias, initializer).init(device),
        )

    def gate_product(self, input, hidden):
        """`Wx x + Wh h + b` for one time step (`input` `[batch, d_input]`)."""
        return self.input_transform.forward(input) + self.hidden_transform.forward(hidden)


class LstmState:
    """An LSTM state: `cell` and `hidden`, each `[batch_size, d_hidden]` (`[2, ...]` for BiLstm)."""

    __slots__ = ("cell", "hidden")

    def __init__(self, cell, hidden):
        self.cell = cell
        self.hidden = hidden

    def __iter__(self):
        return iter((self.cell, self.hidden))

    def __repr__(self) -> str:
        return f"LstmState(cell dims {list(self.cell.shape)}, hidden dims {list(self.hidden.shape)})"


def _zeros_like_state(x, batch_size: int, d_hidden: int):
    from ..tensor import Tensor  # noqa: PLC0415

    return Tensor.zeros([batch_size, d_hidden], device=x.device, dtype=x.dtype)


def _steps(seq_length: int, reverse: bool):
    return range(seq_length - 1, -1, -1) if reverse else range(seq_length)


# ---------------------------------------------------------------------- LSTM
@dataclass
class LstmConfig(Config):
    """Configuration of an [`Lstm`] (Burn's fields; `bias` has no default, as in Burn)."""

    d_input: int
    d_hidden: int
    bias: bool
    initializer: object = field(default_factory=_xavier_default)
    batch_first: bool = True
    reverse: bool = False
    clip: float | None = None
    input_forget: bool = False
    gate_activation: object = "Sigmoid"
    cell_activation: object = "Tanh"
    hidden_activation: object = "Tanh"

    def init(self, device=None) -> "Lstm":
        def gate():
            return GateController.new(self.d_input, self.d_hidden, self.bias, self.initializer, device)

        return Lstm(
            gate(), gate(), gate(), gate(), self.d_hidden, self.batch_first, self.reverse, self.clip,
            self.input_forget, ActivationConfig.of(self.gate_activation).init(device),
            ActivationConfig.of(self.cell_activation).init(device),
            ActivationConfig.of(self.hidden_activation).init(device),
        )


class Lstm(Layer):
    """A unidirectional LSTM; returns the hidden state of every step and the final state."""

    def __init__(self, input_gate, forget_gate, output_gate, cell_gate, d_hidden, batch_first, reverse, clip,
                 input_forget, gate_activation, cell_activation, hidden_activation):
        super().__init__()
        self.input_gate = input_gate
        self.forget_gate = forget_gate
        self.output_gate = output_gate
        self.cell_gate = cell_gate
        self.d_hidden = int(d_hidden)
        self.batch_first = bool(batch_first)
        self.reverse = bool(reverse)
        self.clip = None if clip is None else float(clip)
        self.input_forget = bool(input_forget)
        self.gate_activation = gate_activation
        self.cell_activation = cell_activation
        self.hidden_activation = hidden_activation

    def forward(self, batched_input, state: LstmState | None = None):
        """Runs the LSTM over the sequence.

        # Shapes

        - batched_input: `[batch_size, seq_length, d_input]` (`[seq_length, batch_size, d_input]`
          when not batch_first)
        - state: cell and hidden `[batch_size, d_hidden]` (zeros when None)
        - output: `[batch_size, seq_length, d_hidden]` (seq first when not batch_first)
        - final state: cell and hidden `[batch_size, d_hidden]`
        """
        d_input = self.input_gate.input_transform.weight.shape[0]
        assert_shape(batched_input, [None, None, d_input])
        weight = self.input_gate.input_transform.weight.val()
        check_dtype(self, batched_input, weight, name="batched_input")
        x = batched_input if self.batch_first else batched_input.swap_dims(0, 1)
        batch_size = x.shape[0]
        if state is not None:
            assert_shape(state.cell, [batch_size, self.d_hidden])
            assert_shape(state.hidden, [batch_size, self.d_hidden])
            check_dtype(self, state.cell, weight, name="state.cell")
            check_dtype(self, state.hidden, weight, name="state.hidden")
        out, final = self._run(x, state, self.reverse)
        return (out if self.batch_first else out.swap_dims(0, 1)), final

    def _run(self, x, state, reverse: bool):
        batch_size, seq_length, _ = x.shape
        if state is None:
            cell = _zeros_like_state(x, batch_size, self.d_hidden)
            hidden = cell
        else:
            cell, hidden = state.cell, state.hidden
        # input projections of every step at once: [batch, seq, d_hidden] per gate
        xi = self.input_gate.input_transform.forward(x)
        xf = None if self.input_forget else self.forget_gate.input_transform.forward(x)
        xo = self.output_gate.input_transform.forward(x)
        xc = self.cell_gate.input_transform.forward(x)
        outputs = [None] * seq_length
        for t in _steps(seq_length, reverse):
            i = self.gate_activation.forward(xi[:, t] + self.input_gate.hidden_transform.forward(hidden))
            if self.input_forget:
                f = 1.0 - i
            else:
                f = self.gate_activation.forward(xf[:, t] + self.forget_gate.hidden_transform.forward(hidden))
            o = self.gate_activation.forward(xo[:, t] + self.output_gate.hidden_transform.forward(hidden))
            g = self.cell_activation.forward(xc[:, t] + self.cell_gate.hidden_transform.forward(hidden))
            cell = f * cell + i * g
            if self.clip is not None:
                cell = cell.clamp(-self.clip, self.clip)
            hidden = o * self.hidden_activation.forward(cell)
            outputs[t] = hidden
        return stack(outputs, 1), LstmState(cell, hidden)

    def custom_content(self, content):
        d_input = self.input_gate.input_transform.weight.shape[0]
        return (
            content.add("d_input", d_input)
            .add("d_hidden", self.d_hidden)
            .add("bias", self.input_gate.input_transform.bias is not None)
            .optional()
        )


@dataclass
class BiLstmConfig(Config):
    """Configuration of a [`BiLstm`]."""

    d_input: int
    d_hidden: int
    bias: bool
    initializer: object = field(default_factory=_xavier_default)
    batch_first: bool = True
    clip: float | None = None
    input_forget: bool = False
    gate_activation: object = "Sigmoid"
    cell_activation: object = "Tanh"
    hidden_activation: object = "Tanh"

    def init(self, device=None) -> "BiLstm":
        base = LstmConfig(self.d_input, self.d_hidden, self.bias, self.initializer, True, False, self.clip,
                          self.input_forget, self.gate_activation, self.cell_activation, self.hidden_activation)
        return BiLstm(base.init(device), base.init(device), self.d_hidden, self.batch_first)


class _Bidirectional(Layer):
    """A forward and a reverse recurrent layer, outputs concatenated along the features.

    Burn names the forward direction's field `forward`; it is kept in the instance dict (a field,
    so paths read `forward.…`) while `layer.forward(...)` still runs the layer (see
    `__getattribute__`). Subclasses name `_GATE`, the gate whose input transform tells d_input.
    """

    _GATE = ""

    def __init__(self, forward, reverse, d_hidden: int, batch_first: bool):
        super().__init__()
        self.__dict__["forward"] = forward
        self.reverse = reverse
        self.d_hidden = int(d_hidden)
        self.batch_first = bool(batch_first)

    def __getattribute__(self, name):
        if name == "forward":
            return object.__getattribute__(self, "_bi_forward")
        return object.__getattribute__(self, name)

    @property
    def forward_direction(self):
        """The forward-direction layer (the field `forward`, as Burn names it)."""
        return self.__dict__["forward"]

    def _input_transform(self):
        return getattr(self.forward_direction, self._GATE).input_transform

    def _sequence_first(self, batched_input):
        transform = self._input_transform()
        assert_shape(batched_input, [None, None, transform.weight.shape[0]])
        check_dtype(self, batched_input, transform.weight.val(), name="batched_input")
        return batched_input if self.batch_first else batched_input.swap_dims(0, 1)

    def _both(self, x, state_forward, state_reverse):
        """Both directions over `x` (batch first): the concatenated output and each final state."""
        out_f, st_f = self.forward_direction._run(x, state_forward, False)
        out_r, st_r = self.reverse._run(x, state_reverse, True)
        out = cat([out_f, out_r], 2)
        return (out if self.batch_first else out.swap_dims(0, 1)), st_f, st_r

    def custom_content(self, content):
        transform = self._input_transform()
        return (
            content.add("d_input", transform.weight.shape[0])
            .add("d_hidden", self.d_hidden)
            .add("bias", transform.bias is not None)
            .optional()
        )


class BiLstm(_Bidirectional):
    """A bidirectional LSTM: a forward and a reverse Lstm, outputs concatenated."""

    _GATE = "input_gate"

    @property
    def forward_lstm(self):
        """The forward-direction Lstm (the field `forward`, as Burn names it)."""
        return self.forward_direction

    def _bi_forward(self, batched_input, state: LstmState | None = None):
        """Runs both directions over the sequence.

        # Shapes

        - batched_input: `[batch_size, seq_length, d_input]` (seq first when not batch_first)
        - state: cell and hidden `[2, batch_size, d_hidden]` (forward, reverse; zeros when None)
        - output: `[batch_size, seq_length, 2 * d_hidden]`
        - final state: cell and hidden `[2, batch_size, d_hidden]`
        """
        x = self._sequence_first(batched_input)
        batch_size = x.shape[0]
        sf = sr = None
        if state is not None:
            assert_shape(state.cell, [2, batch_size, self.d_hidden])
            assert_shape(state.hidden, [2, batch_size, self.d_hidden])
            weight = self._input_transform().weight.val()
            check_dtype(self, state.cell, weight, name="state.cell")
            check_dtype(self, state.hidden, weight, name="state.hidden")
            sf = LstmState(state.cell[0], state.hidden[0])
            sr = LstmState(state.cell[1], state.hidden[1])
        out, st_f, st_r = self._both(x, sf, sr)
        return out, LstmState(stack([st_f.cell, st_r.cell], 0), stack([st_f.hidden, st_r.hidden], 0))


# ---------------------------------------------------------------------- GRU
@dataclass
class GruConfig(Config):
    """Configuration of a [`Gru`]."""

    d_input: int
    d_hidden: int
    bias: bool
    reset_after: bool = True
    initializer: object = field(default_factory=_xavier_default)
    gate_activation: object = "Sigmoid"
    hidden_activation: object = "Tanh"
    clip: float | None = None
    batch_first: bool = True

    def init(self, device=None) -> "Gru":
        def gate():
            return GateController.new(self.d_input, self.d_hidden, self.bias, self.initializer, device)

        return Gru(gate(), gate(), gate(), self.d_hidden, self.reset_after,
                   ActivationConfig.of(self.gate_activation).init(device),
                   ActivationConfig.of(self.hidden_activation).init(device), self.clip, self.batch_first)


class Gru(Layer):
    """A unidirectional GRU; `reset_after` applies the reset gate after the hidden product."""

    def __init__(self, update_gate, reset_gate, new_gate, d_hidden, reset_after, gate_activation,
                 hidden_activation, clip, batch_first=True):
        super().__init__()
        self.update_gate = update_gate
        self.reset_gate = reset_gate
        self.new_gate = new_gate
        self.d_hidden = int(d_hidden)
        self.reset_after = bool(reset_after)
        self.gate_activation = gate_activation
        self.hidden_activation = hidden_activation
        self.clip = None if clip is None else float(clip)
        self.batch_first = bool(batch_first)

    def forward(self, batched_input, state=None):
        """Runs the GRU over the sequence; returns the hidden state of every step.

        # Shapes

        - batched_input: `[batch_size, seq_length, d_input]` (seq first when not batch_first)
        - state: `[batch_size, d_hidden]` (zeros when None)
        - output: `[batch_size, seq_length, d_hidden]` (seq first when not batch_first)
        """
        d_input = self.update_gate.input_transform.weight.shape[0]
        assert_shape(batched_input, [None, None, d_input])
        weight = self.update_gate.input_transform.weight.val()
        check_dtype(self, batched_input, weight, name="batched_input")
        x = batched_input if self.batch_first else batched_input.swap_dims(0, 1)
        if state is not None:
            assert_shape(state, [x.shape[0], self.d_hidden])
            check_dtype(self, state, weight, name="state")
        out, _ = self._run(x, state, False)
        return out if self.batch_first else out.swap_dims(0, 1)

    def _run(self, x, state, reverse: bool):
        batch_size, seq_length, _ = x.shape
        hidden = _zeros_like_state(x, batch_size, self.d_hidden) if state is None else state
        xu = self.update_gate.input_transform.forward(x)
        xr = self.reset_gate.input_transform.forward(x)
        xn = self.new_gate.input_transform.forward(x)
        outputs = [None] * seq_length
        for t in _steps(seq_length, reverse):
            z = self.gate_activation.forward(xu[:, t] + self.update_gate.hidden_transform.forward(hidden))
            r = self.gate_activation.forward(xr[:, t] + self.reset_gate.hidden_transform.forward(hidden))
            if self.reset_after:
                pre = xn[:, t] + r * self.new_gate.hidden_transform.forward(hidden)
            else:
                pre = xn[:, t] + self.new_gate.hidden_transform.forward(hidden * r)
            n = self.hidden_activation.forward(pre)
            hidden = n * (1.0 - z) + z * hidden
            if self.clip is not None:
                hidden = hidden.clamp(-self.clip, self.clip)
            outputs[t] = hidden
        return stack(outputs, 1), hidden

    def custom_content(self, content):
        d_input = self.update_gate.input_transform.weight.shape[0]
        return (
            content.add("d_input", d_input)
            .add("d_hidden", self.d_hidden)
            .add("bias", self.update_gate.input_transform.bias is not None)
            .add("reset_after", self.reset_after)
            .optional()
        )


@dataclass
class BiGruConfig(Config):
    """Configuration of a [`BiGru`]."""

    d_input: int
    d_hidden: int
    bias: bool
    reset_after: bool = True
    initializer: object = field(default_factory=_xavier_default)
    batch_first: bool = True
    gate_activation: object = "Sigmoid"
    hidden_activation: object = "Tanh"
    clip: float | None = None

    def init(self, device=None) -> "BiGru":
        base = GruConfig(self.d_input, self.d_hidden, self.bias, self.reset_after, self.initializer,
                         self.gate_activation, self.hidden_activation, self.clip, True)
        return BiGru(base.init(device), base.init(device), self.d_hidden, self.batch_first)


class BiGru(_Bidirectional):
    """A bidirectional GRU: a forward and a reverse Gru, outputs concatenated."""

    _GATE = "update_gate"

    @property
    def forward_gru(self):
        """The forward-direction Gru (the field `forward`, as Burn names it)."""
        return self.forward_direction

    def _bi_forward(self, batched_input, state=None):
        """Runs both directions over the sequence.

        # Shapes

        - batched_input: `[batch_size, seq_length, d_input]` (seq first when not batch_first)
        - state: `[2, batch_size, d_hidden]` (forward, reverse; zeros when None)
        - output: `[batch_size, seq_length, 2 * d_hidden]`
        - final state: `[2, batch_size, d_hidden]`
        """
        x = self._sequence_first(batched_input)
        sf = sr = None
        if state is not None:
            assert_shape(state, [2, x.shape[0], self.d_hidden])
            check_dtype(self, state, self._input_transform().weight.val(), name="state")
            sf, sr = state[0], state[1]
        out, h_f, h_r = self._both(x, sf, sr)
        return out, stack([h_f, h_r], 0)


# ---------------------------------------------------------------------------------- declarations
# Each layer's shape rule and what it declares to the designer and the exporters (engine.nn.spec).
def _lstm_shape(m, ins, ctx):
    d_input = m.input_gate.input_transform.weight.shape[0]
    expect("assert_shape(batched_input, [None, None, d_input])", ins[0], [None, None, d_input])
    float_input("Lstm", ins[0], "batched_input")
    return Shape(with_dim(ins[0].dims, 2, m.d_hidden))


def _gru_shape(m, ins, ctx):
    d_input = m.update_gate.input_transform.weight.shape[0]
    expect("assert_shape(batched_input, [None, None, d_input])", ins[0], [None, None, d_input])
    float_input("Gru", ins[0], "batched_input")
    return Shape(with_dim(ins[0].dims, 2, m.d_hidden))


def _bidirectional_shape(m, ins, ctx):
    d_input = m._input_transform().weight.shape[0]
    expect("assert_shape(batched_input, [None, None, transform.weight.shape[0]])", ins[0], [None, None, d_input])
    float_input(type(m).__name__, ins[0], "batched_input")
    return Shape(with_dim(ins[0].dims, 2, 2 * m.d_hidden))


declare(Lstm, shape=_lstm_shape)
declare(Gru, shape=_gru_shape)
declare(BiLstm, BiGru, shape=_bidirectional_shape)
declare(Lstm, burn=Burn("", call="{m}.forward({x}, None).0"))
declare(Gru, burn=Burn("", call="{m}.forward({x}, None)"))
declare(Lstm, BiLstm, BiGru, call="first")  # forward(x) returns (output, state): the designer takes the output
