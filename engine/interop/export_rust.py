"""Export a design as Rust: a Burn `#[derive(Module)]` struct, its `ModelConfig` and `forward`.

Written for Burn's current API (the one `shared/spec/module-system.md` documents): modules and
tensors without a backend parameter (`Linear`, `Tensor<3>`), `init(&self, device: &Device)`,
`assert_shape!` from the prelude. A dotted block becomes a struct of its own (`conv1` ->
`Conv1Block`) so field paths, and so checkpoint tensor names, are the same as in the app: the
weights exported as `.bpk` load into the Rust model.

The layout follows rustfmt (edition 2024): imports grouped in one `use burn::{...}` tree, types
before modules, method chains over 60 columns broken one call a line.

Layers without a Burn counterpart this exporter knows (or with settings that do not map
one-to-one, such as a non-default activation) raise `ExportError` naming the node.
"""
from __future__ import annotations


from ..design.catalog import NodeSpec
from .export_common import ExportError, Plan, block_type, bound_axis_names, dim_expr, plan_export, shape_pattern
from ..design.graph import Design
from ..nn.spec import layer_specs
from ..design.shapes import Analysis, format_dims

__all__ = ["export_rust"]

WIDTH = 100
CHAIN_WIDTH = 60


def _burn(kind: str):
    """How Burn names and builds the layer kind (its `declare(..., burn=Burn(...))`, engine.nn.spec), or None."""
    return _burn_layers().get(kind)


def _burn_layers() -> dict:
    return {cls.__name__: spec.burn for cls, spec in layer_specs().items() if spec.burn is not None}


# Engine fields that are optional (None = Burn's default) where Burn's field is not an Option.
_PLAIN_IN_BURN = {("MaxPool2d", "strides"), ("AvgPool2d", "strides"), ("MaxPool1d", "stride"),
                  ("AvgPool1d", "stride")}
_TENSOR_KIND = {"float": "", "int": ", Int", "bool": ", Bool"}
# Engine fields Burn's config does not have: exported only at their default (Burn's behaviour).
_ENGINE_ONLY = {("MultiHeadAttention", "bias"), ("MultiHeadAttention", "output_bias"),
                ("MultiHeadAttention", "causal"), ("RmsNorm", "offset")}


def _float(v: float) -> str:
    text = repr(float(v))
    if "e" in text:
        mant, exp = text.split("e")
        sign = "-" if exp.startswith("-") else ""
        return f"{mant}e{sign}{exp.lstrip('+-').lstrip('0') or '0'}"
    return text


def _literal(node: str, kind: str, field, value, uses: set) -> str:
    k = field.kind
    if k == "int":
        return str(value)
    if k == "float":
        return _float(value)
    if k == "bool":
        return "true" if value else "false"
    if k == "ints":
        return "[" + ", ".join(str(v) for v in value) + "]"
    if k == "floats":
        return "[" + ", ".join(_float(v) for v in value) + "]"
    if k == "padding":
        cls = field.padding_class.__name__
        uses.add(("", cls))
        if isinstance(value, str):
            return f"{cls}::{value}"
        return f"{cls}::Explicit({', '.join(str(v) for v in value)})"
    raise ExportError(f"{node}: the {kind} field {field.name} = {value!r} has no Rust form in this exporter")


def _layer_init(node: str, spec: NodeSpec, values: dict, uses: set) -> str:
    rl = _burn(spec.kind)
    if rl is None:
        raise ExportError(f"{node}: {spec.kind} has no Burn counterpart in the Rust exporter "
                          f"(supported: {', '.join(sorted(_burn_layers()))})")
    ty = spec.kind
    uses.add((rl.module, ty))
    if not rl.config:
        return f"{ty}::new()"
    cfg = f"{ty}Config"
    uses.add((rl.module, cfg))
    required, withs = [], []
    for f in spec.fields:
        v = values.get(f.name)
        if f.required:
            required.append(_literal(node, spec.kind, f, v, uses))
            continue
        if v == f.default:
            continue
        if (f.optional and (spec.kind, f.name) not in _PLAIN_IN_BURN) or (spec.kind, f.name) in _ENGINE_ONLY:
            raise ExportError(f"{node}: {spec.kind}.{f.name} = {v!r} has no Rust form in this exporter "
                              f"(leave it at its default to export)")
        if v is None:
            continue
        withs.append(f".with_{f.name}({_literal(node, spec.kind, f, v, uses)})")
    calls = [f"{cfg}::new({', '.join(required)})"] + withs + [f".init({'device' if rl.device else ''})"]
    return _chain(calls)


def _chain(calls: list[str]) -> str:
    """A method chain, joined on one line or (over CHAIN_WIDTH) broken one call a line; the
    broken form is returned with newlines and is re-indented by the caller."""
    one = "".join(calls)
    if len(one) <= CHAIN_WIDTH or len(calls) == 1:
        return one
    return calls[0] + "".join("\n    " + c for c in calls[1:])


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return text.replace("\n", "\n" + pad)


def _type(spec: NodeSpec) -> str:
    return spec.kind


def _imports(uses: set) -> list[str]:
    groups: dict[str, set] = {}
    for module, name in uses:
        groups.setdefault(module, set()).add(name)
    top = sorted(groups.get("", set()), key=_sort_key)
    subs = sorted(m for m in groups if m)
    items = top + [f"{m}::{{{', '.join(sorted(groups[m], key=_sort_key))}}}" for m in subs]
    lines = ["use burn::{"]
    nn_inline = f"    nn::{{{', '.join(items)}}},"
    if len(nn_inline) <= WIDTH:
        lines.append(nn_inline)
    else:
        lines.append("    nn::{")
        lines += _wrap(top, 8)
        for m in subs:
            inline = f"        {m}::{{{', '.join(sorted(groups[m], key=_sort_key))}}},"
            if len(inline) <= WIDTH:
                lines.append(inline)
            else:
                lines.append(f"        {m}::{{")
                lines += _wrap(sorted(groups[m], key=_sort_key), 12)
                lines.append("        },")
        lines.append("    },")
    lines += ["    prelude::*,", "};"]
    return lines


def _sort_key(name: str):
    return name


def _wrap(items: list[str], indent: int) -> list[str]:
    lines, cur = [], ""
    for it in items:
        piece = it + ","
        if cur and len(" " * indent + cur + " " + piece) > WIDTH:
            lines.append(" " * indent + cur)
            cur = piece
        else:
            cur = piece if not cur else cur + " " + piece
    if cur:
        lines.append(" " * indent + cur)
    return lines


def export_rust(design: Design, analysis: Analysis | None = None) -> str:
    """The Rust source (Burn) of the design; `ExportError` names a node that cannot be exported."""
    plan = plan_export(design, analysis)
    d = plan.design
    uses: set = set()
    structs: list[str] = []
    init_of: dict[str, str] = {}
    for n in d.nodes():
        spec = d.spec(n)
        if not spec.structural:
            init_of[n] = _layer_init(n, spec, d.config(n), uses)

    def struct(name: str, entries: list[tuple[str, str]]) -> list[str]:
        out = ["#[derive(Module, Debug)]", f"pub struct {name} {{"]
        out += [f"    {f}: {t}," for f, t in entries]
        return out + ["}"]

    def entry_type(target: str, is_block: bool) -> str:
        return block_type(target) if is_block else _type(d.spec(target))

    for path in sorted(plan.blocks, key=lambda p: p.count(".")):
        structs += [""] + struct(block_type(path), [(c, entry_type(t, b)) for c, t, b in plan.blocks[path]])
    top = [(name, _type(d.spec(node)) if node else block_type(name)) for name, node in plan.fields]
    structs += [""] + struct(d.name, top)

    def literal(path: str | None, node: str | None, indent: int) -> str:
        if node is not None:
            return _indent(init_of[node], indent)
        lines = [f"{block_type(path)} {{"]
        for child, target, is_block in plan.blocks[path]:
            value = literal(target, None, indent + 4) if is_block else literal(None, target, indent + 4)
            lines.append(" " * (indent + 4) + f"{child}: {value},")
        lines.append(" " * indent + "}")
        return "\n".join(lines)

    cfg = ["", "#[derive(Config, Debug)]", f"pub struct {d.name}Config {{}}", "", f"impl {d.name}Config {{",
           "    /// Returns the initialized model.", f"    pub fn init(&self, device: &Device) -> {d.name} {{",
           f"        {d.name} {{"]
    for name, node in plan.fields:
        cfg.append(f"            {name}: {literal(name, node, 12)},")
    cfg += ["        }", "    }", "}"]
    forward = _forward(plan, uses)
    header = [f"//! `{d.name}`: generated by Ember from a design.", ""]
    return "\n".join(header + _imports(uses) + structs + cfg + [""] + forward) + "\n"


def _forward(plan: Plan, uses: set) -> list[str]:
    d = plan.design
    inputs, outputs = d.inputs(), d.outputs()
    # every use of every value, in statement order, to clone all but the last
    stmts = []  # (outs, kind, node, ins)
    for n in plan.order:
        spec = d.spec(n)
        values = d.config(n)
        ins = [plan.vars[plan.input_of(n, p)] for p in spec.input_ports(values)]
        stmts.append((n, spec, values, ins))
    remaining: dict[str, int] = {}
    for n, spec, values, ins in stmts:
        for v in ins:
            remaining[v] = remaining.get(v, 0) + 1

    def use(v: str) -> str:
        remaining[v] -= 1
        return v if remaining[v] == 0 else f"{v}.clone()"

    def rank_type(t) -> str:
        return f"Tensor<{t.rank}{_TENSOR_KIND[t.dtype]}>"

    args = []
    for n in inputs:
        t = plan.analysis.state(n).outputs["output"]
        args.append(f"{plan.vars[(n, 'output')]}: {rank_type(t)}")
    out_shapes = plan.analysis.output_shapes()
    rets = [rank_type(out_shapes[o]) for o in outputs]
    ret = rets[0] if len(rets) == 1 else "(" + ", ".join(rets) + ")"
    lines = [f"impl {d.name} {{", "    /// # Shapes", "    ///"]
    for n in inputs:
        lines.append(f"    /// - {n}: `{format_dims(d.config(n)['shape'])}`")
    for o in outputs:
        lines.append(f"    /// - {o}: `{out_shapes[o].text()}`")
    sig = f"    pub fn forward(&self, {', '.join(args)}) -> {ret} {{"
    if len(sig) > WIDTH:
        lines.append("    pub fn forward(")
        lines.append("        &self,")
        lines += [f"        {a}," for a in args]
        lines.append(f"    ) -> {ret} {{")
    else:
        lines.append(sig)
    body = []
    for n, names in bound_axis_names(plan, inputs):
        body.append(f"let [{', '.join(names)}] = {plan.vars[(n, 'output')]}.dims();")
    for n in inputs:
        pattern = shape_pattern(d.config(n)["shape"], plan.axes, "_")
        body.append(f"assert_shape!({plan.vars[(n, 'output')]}, {pattern});")
    body.append("")
    for n, spec, values, ins in stmts:
        k = spec.kind
        if k == "Output":
            continue
        outs = [plan.vars[(n, p)] for p in spec.output_ports(values)]
        state = plan.analysis.state(n)
        if k == "Add":
            rhs = " + ".join(use(v) for v in ins)
        elif k == "Concat":
            rhs = f"Tensor::cat(vec![{', '.join(use(v) for v in ins)}], {_axis(values['dim'], state.inputs['in0'].rank)})"
        elif k == "Reshape":
            rhs = _reshape(use(ins[0]), state, plan)
        elif k == "Flatten":
            rank = state.inputs["input"].rank
            s, e = _axis(values["start_dim"], rank), _axis(values["end_dim"], rank)
            rhs = f"{use(ins[0])}.flatten::<{state.outputs['output'].rank}>({s}, {e})"
        elif k == "Split":
            dim = _axis(values["dim"], state.inputs["input"].rank)
            src = ins[0]
            start = 0
            n_out = len(values["sizes"])
            for i, (o, size) in enumerate(zip(outs, values["sizes"])):
                x = f"{src}.clone()" if i < n_out - 1 else use(src)
                body.append(f"let {o} = {x}.narrow({dim}, {start}, {size});")
                start += size
            continue
        else:
            rl = _burn(k)
            if rl is None:  # a primitive op of an imported ONNX graph (structural, no Burn layer)
                raise ExportError(f"{n}: {k} ({values.get('op', k) if isinstance(values, dict) else k}) has no "
                                  f"Rust form in this exporter; supported structural kinds: Add, Concat, "
                                  f"Reshape, Flatten, Split")
            rhs = rl.call.format(m=f"self.{n}", x=", ".join(use(v) for v in ins))
            for module, name in rl.extra_imports:
                uses.add((module, name))
        stmt = f"let {outs[0]} = {rhs};"
        body.append(stmt)
    body.append("")
    results = []
    for o in outputs:
        v = plan.vars[plan.input_of(o, "input")]
        body.append(f"assert_shape!({v}, {shape_pattern(out_shapes[o].sym, plan.axes, '_')});")
        results.append(v)
    body.append(results[0] if len(results) == 1 else "(" + ", ".join(results) + ")")
    lines += [("        " + b) if b else "" for b in body]
    lines += ["    }", "}"]
    return lines


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _reshape(x: str, state, plan: Plan) -> str:
    out = state.outputs["output"]
    parts = [dim_expr(dd, plan.axes, "rust") for dd in out.sym]
    if all(p is not None for p in parts):
        return f"{x}.reshape([{', '.join(parts)}])"
    # a size only the run time knows: Burn infers one -1 from an i32 shape
    src = state.inputs["input"]
    values = []
    for p in parts:
        values.append(f"{p} as i32" if p is not None and not p.isdigit() else (p if p is not None else "-1"))
    if values.count("-1") != 1:
        raise ExportError(f"cannot express the reshape of {src.text()} into {out.text()} in Rust")
    return f"{x}.reshape([{', '.join(values)}])"
