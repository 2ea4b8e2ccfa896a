"""Shape contracts with named axes, read from docstrings, edited by the user, checked at run time.

A contract reads like the `Shapes` section of a docstring: `[batch, 784] -> [batch, 10]`;
several tensors are separated by commas: `[batch, seq], [batch, seq] -> [batch, seq, d_model]`.
A slot is an int, a name (bound the first time it is seen in one call, then checked), `_`
(skip an axis), `..` (any number of axes, once per pattern) or an expression of names and ints
(`d_model * 2`). A name that is an int attribute of the module (`d_model`, `d_input`, …) means
that attribute's value.

`check(module, input, contracts)` runs the input through the module with a check at every module
boundary and reports, per module path, whether the contract held, the shapes that flowed, and the
exact error at the first failing node.
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

ELLIPSIS = ".."
SKIP = "_"

OK = "ok"
VIOLATED = "violated"
INSIDE = "failed inside"
NOT_RUN = "not run"
NOT_CHECKED = "not checked"  # a shape-only check could not see through this module


class NotCheckable(Exception):
    """A shape-only check cannot see through a module (no shape rule, and its forward needs
    values): the check stops there and says so, rather than guessing."""


class ContractSyntaxError(ValueError):
    """A contract that cannot be parsed: says where and what was expected."""


# ---- parsing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pattern:
    slots: tuple[str, ...]  # each: SKIP, ELLIPSIS, or an expression's source text

    def __str__(self) -> str:
        return "[" + ", ".join(self.slots) + "]"

    @property
    def has_ellipsis(self) -> bool:
        return ELLIPSIS in self.slots


@dataclass(frozen=True)
class Contract:
    inputs: tuple[Pattern, ...]
    outputs: tuple[Pattern, ...]

    def __str__(self) -> str:
        return ", ".join(map(str, self.inputs)) + " -> " + ", ".join(map(str, self.outputs))


_SLOT_NAMES = re.compile(r"[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*")


def _split_patterns(text: str, where: str) -> list[Pattern]:
    patterns: list[Pattern] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace() or ch == ",":
            i += 1
            continue
        if ch != "[":
            raise ContractSyntaxError(f"{where}: expected '[' to start a shape at column {i + 1}, found {ch!r}")
        j = text.find("]", i)
        if j < 0:
            raise ContractSyntaxError(f"{where}: the shape starting at column {i + 1} has no closing ']'")
        body = text[i + 1:j]
        slots = tuple(s.strip() for s in body.split(",")) if body.strip() else ()
        for s in slots:
            _check_slot(s, where)
        if sum(s == ELLIPSIS for s in slots) > 1:
            raise ContractSyntaxError(f"{where}: '..' may appear once in a shape, found it twice in [{body}]")
        patterns.append(Pattern(slots))
        i = j + 1
    return patterns


_OPERATORS = {ast.Div: "/", ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
              ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}


def _describe_node(node) -> str:
    """What the user wrote that a contract axis cannot hold, in the user's terms (never an AST name)."""
    if isinstance(node, ast.UnaryOp):
        return "is negative (a sign before a size)" if isinstance(node.op, ast.USub) else "has a sign or 'not'"
    op = _OPERATORS.get(type(node))
    if op is not None:
        return f"uses the operator {op}"
    if isinstance(node, ast.Call):
        return "calls a function"
    if isinstance(node, (ast.Subscript, ast.Slice)):
        return "uses indexing"
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        return "uses a comparison"
    return "is not a size expression"


def _check_slot(slot: str, where: str) -> None:
    if slot in (SKIP, ELLIPSIS):
        return
    if slot == "":
        raise ContractSyntaxError(f"{where}: empty axis in a shape (two commas in a row?)")
    try:
        tree = ast.parse(slot, mode="eval")
    except SyntaxError:
        raise ContractSyntaxError(
            f"{where}: axis {slot!r} is not a name, an integer, '_', '..' or an expression of those") from None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.Name, ast.Load, ast.Constant, ast.BinOp, ast.Add, ast.Sub,
                                 ast.Mult, ast.FloorDiv, ast.Attribute)):
            raise ContractSyntaxError(f"{where}: axis {slot!r} {_describe_node(node)}; only names, integers "
                                      f"(positive), '_', '..' and + - * // of those are allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ContractSyntaxError(f"{where}: axis {slot!r} has a non-integer constant {node.value!r}")


def parse_contract(text: str) -> Contract:
    """Parse `[a, b] -> [a, c]`; a `ContractSyntaxError` says what was expected and where."""
    text = text.strip()
    if "->" not in text:
        raise ContractSyntaxError(f"contract {text!r}: expected 'inputs -> outputs', e.g. [batch, 784] -> [batch, 10]")
    left, _, right = text.partition("->")
    if "->" in right:
        raise ContractSyntaxError(f"contract {text!r}: expected one '->', found more")
    inputs = _split_patterns(left, "inputs")
    outputs = _split_patterns(right, "outputs")
    if not inputs:
        raise ContractSyntaxError(f"contract {text!r}: expected at least one input shape before '->'")
    return Contract(tuple(inputs), tuple(outputs))


_SECTION = re.compile(r"^\s*(?:#+\s*)?Shapes\s*:?\s*$", re.IGNORECASE)
_ENTRY = re.compile(r"^\s*[-*]\s*([A-Za-z_][\w ]*?)\s*:\s*`?\s*(\[[^\]]*\])\s*`?")


def docstring_contract(module: Any) -> str | None:
    """The contract in the `Shapes` section of the module's `forward` (or class) docstring."""
    return class_contract(type(module))


@functools.lru_cache(maxsize=1024)
def class_contract(cls: type) -> str | None:
    """`docstring_contract` for a class (cached: docstrings do not change)."""
    for doc in (getattr(getattr(cls, "forward", None), "__doc__", None), cls.__doc__):
        if not doc:
            continue
        text = _contract_from_doc(inspect.cleandoc(doc))
        if text:
            return text
    return None


def _contract_from_doc(doc: str) -> str | None:
    lines = doc.splitlines()
    inputs: list[str] = []
    outputs: list[str] = []
    in_section = False
    for line in lines:
        if _SECTION.match(line):
            in_section = True
            continue
        if not in_section:
            continue
        m = _ENTRY.match(line)
        if m:
            name, shape = m.group(1).strip(), m.group(2)
            shape = re.sub(r"(?<=[\[,\s])\*(?=[\],\s])", "..", shape.replace("...", ".."))
            (outputs if name.lower().startswith("output") else inputs).append(shape)
        elif line.strip() and not line.startswith((" ", "\t")) and (inputs or outputs):
            break  # the next section begins
    if not inputs:
        return None
    text = ", ".join(inputs) + " -> " + ", ".join(outputs)
    try:
        parse_contract(text)
    except ContractSyntaxError:
        return None
    return text


# ---- matching --------------------------------------------------------------------------------
class ContractMismatch(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _module_env(module: Any) -> dict[str, int]:
    """The names a contract may use for the module's own sizes: its int fields, and the int
    attributes its display shows (`Linear`'s `d_input`, `d_output`)."""
    env = {}
    for k, v in getattr(module, "__dict__", {}).items():
        if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("_"):
            env[k] = v
    custom = getattr(module, "custom_content", None)
    if custom is not None:
        try:
            from engine.module import Content  # noqa: PLC0415

            content = custom(Content())
        except Exception:  # a display that fails is not this check's business
            content = None
        for attr in getattr(content, "attributes", None) or ():
            if attr.name not in env and re.fullmatch(r"-?\d+", attr.value or ""):
                env[attr.name] = int(attr.value)
    return env


def _eval(slot: str, env: dict[str, int], module: Any) -> int | None:
    """Evaluate an axis expression; `None` when it names something still unbound."""
    tree = ast.parse(slot, mode="eval").body

    def ev(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            raise KeyError(node.id)
        if isinstance(node, ast.Attribute):  # self.d_model
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                v = getattr(module, node.attr, None)
                if isinstance(v, int):
                    return v
            raise KeyError(ast.unparse(node))
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            return a // b
        raise KeyError(slot)

    try:
        return int(ev(tree))
    except KeyError:
        return None


def _is_name(slot: str) -> bool:
    return slot.isidentifier()


def match(pattern: Pattern, dims: tuple[int, ...], env: dict[str, int], module: Any, label: str) -> None:
    """Check `dims` against `pattern`, binding new names into `env`; raise `ContractMismatch`.

    Messages use `assert_shape`'s form: `assert_shape(input, [batch, 784]): axis 1 expected 784,
    got 100 (dims [2, 100])`.
    """
    call = f"assert_shape({label}, {pattern})"
    dims_text = "[" + ", ".join(str(d) for d in dims) + "]"
    slots = pattern.slots
    if pattern.has_ellipsis:
        k = slots.index(ELLIPSIS)
        before, after = slots[:k], slots[k + 1:]
        if len(dims) < len(before) + len(after):
            raise ContractMismatch(f"{call}: rank at least {len(before) + len(after)} expected, "
                                   f"got {len(dims)} (dims {dims_text})")
        pairs = list(zip(range(len(before)), before))
        pairs += [(len(dims) - len(after) + i, s) for i, s in enumerate(after)]
    else:
        if len(dims) != len(slots):
            raise ContractMismatch(f"{call}: rank {len(slots)} expected, got {len(dims)} (dims {dims_text})")
        pairs = list(enumerate(slots))
    # bind bare names first, so that `[n, n * 2]` and `[n * 2, n]` both work
    for axis, slot in pairs:
        if _is_name(slot) and slot != SKIP and slot not in env:
            env[slot] = int(dims[axis])
    for axis, slot in pairs:
        if slot == SKIP:
            continue
        expected = _eval(slot, env, module)
        if expected is None:
            continue  # an expression of names nobody bound: nothing to check
        if int(dims[axis]) != expected:
            raise ContractMismatch(f"{call}: axis {axis} expected {expected}, got {dims[axis]} (dims {dims_text})")


def example_shape(contract: Contract, module: Any, default: int = 2) -> list[list[int]] | None:
    """Concrete input shapes for an example run: named axes from the module or `default`."""
    env = _module_env(module)
    shapes = []
    for pattern in contract.inputs:
        dims = []
        for slot in pattern.slots:
            if slot == ELLIPSIS:
                continue
            if slot == SKIP:
                dims.append(default)
                continue
            v = _eval(slot, env, module)
            if v is None:
                if _is_name(slot):
                    env[slot] = default
                    v = default
                else:
                    return None
            dims.append(v)
        shapes.append(dims)
    return shapes


# ---- checking a run --------------------------------------------------------------------------
@dataclass
class NodeReport:
    path: str
    type_name: str
    status: str = NOT_RUN
    contract: str | None = None
    inputs: list[tuple[int, ...]] = field(default_factory=list)
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    message: str = ""


@dataclass
class Call:
    """One call of a module's forward during a check (a module may be called several times)."""

    path: str
    type_name: str
    inputs: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]] = field(default_factory=list)
    status: str = NOT_RUN


@dataclass
class CheckResult:
    nodes: dict[str, NodeReport]
    flow: list[Call]  # every module call, in the order they were entered
    failure: NodeReport | None = None
    error: str = ""  # the exact message at the first failing node
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    shape_only: bool = False  # shapes flowed through shape rules; no kernel ran, no parameter was allocated
    not_checked: list[str] = field(default_factory=list)  # why parts could not be checked (shape-only)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def complete(self) -> bool:
        return not self.not_checked

    def status(self, path: str) -> str:
        node = self.nodes.get(path)
        return node.status if node else NOT_RUN

    def flow_text(self) -> str:
        """The shapes that flowed, in call order, up to the failing node."""
        lines = []
        for n in self.flow:
            ins = ", ".join(_fmt(s) for s in n.inputs)
            outs = ", ".join(_fmt(s) for s in n.outputs) if n.outputs else "…"
            lines.append(f"{n.path or '(model)'} [{n.type_name}]: {ins} -> {outs}  {n.status}")
        return "\n".join(lines)


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _shapes(value: Any, depth: int = 0, slots: bool = False) -> list:
    """The dims of the tensors in `value`, in order. With `slots`, an input object's absent
    optional tensor (`MhaInput`'s masks) keeps its place as None, so that the contract's
    patterns line up with the object's fields."""
    if hasattr(value, "dims") and hasattr(value, "shape"):
        return [tuple(int(d) for d in value.shape)]
    if depth > 4:
        return []
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_shapes(v, depth + 1, slots))
        return out
    out = []
    for v in input_fields(value):  # an input object such as TransformerEncoderInput
        if v is None and slots:
            out.append(None)
        else:
            out.extend(_shapes(v, depth + 1, slots))
    return out


def input_fields(value: Any) -> list:
    """The field values of a plain input object (`TransformerEncoderInput`: tensor, masks), in
    order; nothing for a module, a class or a builtin value."""
    if hasattr(value, "forward") or isinstance(value, (type, str, bytes, int, float, complex, dict)):
        return []
    if hasattr(value, "__dict__"):
        return list(vars(value).values())
    slots = [n for k in type(value).__mro__ for n in getattr(k, "__slots__", ()) if isinstance(n, str)]
    return [getattr(value, n, None) for n in slots]


def _labels(n: int, name: str) -> list[str]:
    return [name] if n == 1 else [f"{name}{i}" for i in range(n)]


@contextlib.contextmanager
def forwards_through(classes: set[type], run):
    """While the block runs, the `forward` of each class in `classes` on this thread goes through
    `run.call(module, original_forward, args, kwargs)` (a `ModuleRun`: a contract check, a shape-only
    check, a trace's scopes); other threads' models are untouched. Nests: the previous run is
    restored after the block."""
    _Patcher.install(classes)
    prev = getattr(_Patcher._local, "ctx", None)
    _Patcher._local.ctx = run
    try:
        yield run
    finally:
        _Patcher._local.ctx = prev
        _Patcher.uninstall(classes)


class _Patcher:
    """Install a checking `forward` on module classes while a check runs (reference counted).

    The wrapper consults a thread-local context, so a model running on another thread (a
    training run) is untouched.
    """

    _lock = threading.Lock()
    _counts: dict[type, int] = {}
    _originals: dict[type, Callable] = {}
    _local = threading.local()

    @classmethod
    def install(cls, classes: set[type]) -> None:
        with cls._lock:
            for klass in classes:
                if "forward" not in klass.__dict__:
                    continue  # inherited: the class that defines it is patched
                n = cls._counts.get(klass, 0)
                if n == 0:
                    original = klass.__dict__["forward"]
                    cls._originals[klass] = original
                    setattr(klass, "forward", cls._wrap(original))
                cls._counts[klass] = n + 1

    @classmethod
    def uninstall(cls, classes: set[type]) -> None:
        with cls._lock:
            for klass in classes:
                if klass not in cls._counts:
                    continue
                cls._counts[klass] -= 1
                if cls._counts[klass] == 0:
                    setattr(klass, "forward", cls._originals.pop(klass))
                    del cls._counts[klass]

    @classmethod
    def _wrap(cls, original):
        def forward(self, *args, **kwargs):
            ctx = getattr(cls._local, "ctx", None)
            if ctx is None:
                return original(self, *args, **kwargs)
            return ctx.call(self, original, args, kwargs)

        forward.__wrapped__ = original
        forward.__doc__ = original.__doc__
        return forward


class ModuleRun:
    def __init__(self, paths: dict[int, str], contracts: dict[str, Contract], result: CheckResult,
                 checkpoint: Callable[[], None] | None):
        self.paths = paths
        self.contracts = contracts
        self.result = result
        self.active: list[NodeReport] = []
        self.checkpoint = checkpoint
        self.interrupted: BaseException | None = None

    def _tick(self) -> None:
        if self.checkpoint is not None:
            try:
                self.checkpoint()
            except BaseException as e:
                self.interrupted = e
                raise

    def call(self, module, original, args, kwargs):
        path = self.paths.get(id(module))
        if path is None or (self.active and self.active[-1].path == path):
            # not part of the tree, or a class calling its parent's forward (super().forward)
            return original(module, *args, **kwargs)
        self._tick()
        node = self.result.nodes[path]
        call = Call(path, node.type_name, _shapes(list(args) + list(kwargs.values())))
        in_slots = _shapes(list(args) + list(kwargs.values()), slots=True)
        node.inputs, node.outputs = call.inputs, []
        self.result.flow.append(call)
        contract = self.contracts.get(path)
        env = _module_env(module)
        self.active.append(node)
        try:
            if contract is not None:
                self._check(contract.inputs, in_slots, env, module, "input", node)
            out = self.forward(module, original, args, kwargs, node)
            call.outputs = node.outputs = _shapes(out)
            if contract is not None:
                self._check(contract.outputs, call.outputs, env, module, "output", node)
        except BaseException as exc:
            if exc is self.interrupted:
                raise
            if isinstance(exc, NotCheckable):
                if not self.result.not_checked:
                    self.result.not_checked.append(str(exc))
                    call.status = node.status = NOT_CHECKED
                    node.message = str(exc)
                elif node.status == NOT_RUN:
                    call.status = node.status = NOT_CHECKED
                raise
            if self.result.failure is None:
                self.result.failure = node
                self.result.error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                call.status = node.status = VIOLATED
                node.message = self.result.error
            else:
                call.status = node.status = INSIDE
            raise
        finally:
            self.active.pop()
        call.status = OK
        if node.status == NOT_RUN:
            node.status = OK
        return out

    def forward(self, module, original, args, kwargs, node):
        """Run the module's own forward (a shape-only run replaces this with the shape rules)."""
        return original(module, *args, **kwargs)

    def _check(self, patterns, shapes, env, module, label, node):
        if len(shapes) < len(patterns):
            raise ContractMismatch(f"{node.path or 'model'}: {len(patterns)} {label} tensor(s) expected by the "
                                   f"contract, got {len(shapes)}")
        for lab, pattern, dims in zip(_labels(len(patterns), label), patterns, shapes):
            if dims is not None:  # an optional input left out
                match(pattern, dims, env, module, lab)


def check(root: Any, inputs: list[Any], contracts: dict[str, str | Contract],
          modules: list[tuple[str, Any]], checkpoint: Callable[[], None] | None = None,
          run_class: type | None = None) -> CheckResult:
    """Run `root.forward(*inputs)` with contract checks at every module boundary.

    `modules` lists `(path, module)` for every module in the tree (root first, path "");
    `contracts` maps paths to their contracts. Never raises for a failure inside the model:
    the result says where it failed and why. `checkpoint()` is called as each module is
    entered; what it raises (a cancellation) stops the run and propagates. `run_class` (a
    subclass of `ModuleRun`) replaces how a module's forward runs: the shape-only check
    (`engine.design.shape_check`) uses it to apply shape rules instead of kernels.
    """
    parsed = {p: (c if isinstance(c, Contract) else parse_contract(c)) for p, c in contracts.items() if c}
    nodes: dict[str, NodeReport] = {}
    paths: dict[int, str] = {}
    for path, m in modules:
        paths.setdefault(id(m), path)
        c = parsed.get(path)
        nodes[path] = NodeReport(path, type(m).__name__, contract=str(c) if c else None)
    result = CheckResult(nodes, [])
    classes = {k for _, m in modules for k in type(m).__mro__ if "forward" in k.__dict__}
    run = (run_class or ModuleRun)(paths, parsed, result, checkpoint)
    with forwards_through(classes, run):
        _check_forward(root, inputs, run, result)
    return result


def _check_forward(root, inputs, run, result) -> None:
    try:
        out = root.forward(*inputs)
        result.output_shapes = _shapes(out)
    except BaseException as exc:  # noqa: BLE001 - reported, never raised
        if exc is run.interrupted:
            raise
        if isinstance(exc, NotCheckable):
            if not result.not_checked:
                result.not_checked.append(str(exc))
        elif result.failure is None:
            result.error = f"{type(exc).__name__}: {exc}"


# ---- example inputs ----------------------------------------------------------------------------
EXAMPLE = "example"
_INPUT = re.compile(r"\s*(int|float)?\s*\[([^\]]*)\]\s*,?")


def parse_example_input(text: str) -> list[tuple[str, list[int]]] | str:
    """`[2, 784]`, `int[2, 16]`, `[2, 8], [2, 8]` -> [(kind, dims), ...]; `example` -> "example".

    A `ContractSyntaxError` says what was expected and where.
    """
    t = text.strip()
    if t.lower() == EXAMPLE:
        return EXAMPLE
    if not t:
        raise ContractSyntaxError("an example input is required: a shape such as [2, 784], or 'example'")
    out = []
    pos = 0
    while pos < len(t):
        m = _INPUT.match(t, pos)
        if not m:
            raise ContractSyntaxError(f"example input: expected a shape such as [2, 784] or int[2, 16] at column "
                                      f"{pos + 1}, found {t[pos:pos + 12]!r}")
        dims = []
        for part in m.group(2).split(","):
            part = part.strip()
            if not part.isdigit() or int(part) < 1:
                raise ContractSyntaxError(f"example input: every axis must be a positive integer, found {part!r} "
                                          f"in [{m.group(2)}]")
            dims.append(int(part))
        out.append((m.group(1) or "float", dims))
        pos = m.end()
    return out


def make_example_input(spec: list[tuple[str, list[int]]], device, seed: int = 0) -> list:
    """Tensors for a parsed spec: float ones normal(0, 1) from a seeded generator, int ones zero."""
    import numpy as np  # noqa: PLC0415

    from ..tensor import Tensor  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    out = []
    for kind, dims in spec:
        if kind == "int":
            out.append(Tensor.zeros(dims, device=device, dtype="int64"))
        else:
            out.append(Tensor.from_data(rng.standard_normal(dims).astype("float32"), device=device))
    return out


def example_input_text(contract_text: str | None, module: Any) -> str:
    """A default example input from the model's contract: `[batch, 784]` -> `[2, 784]`."""
    if not contract_text:
        return ""
    try:
        shapes = example_shape(parse_contract(contract_text), module)
    except ContractSyntaxError:
        return ""
    if not shapes:
        return ""
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in shapes)
