"""The LoRA dialog: the variant (LoRA, rsLoRA, DoRA, QLoRA), rank, alpha, init std, the targets
(PEFT-style presets for the model's family: "q_proj, v_proj", "all-linear", a custom list of
module names or a regex, matched by `engine.models.peft`'s target rules; or a parameter group),
and QLoRA's block size and double quantization, with a live preview of the parameters LoRA adds
and of what stays trainable. "Also train fully" offers peft's `modules_to_save` for the embedding
and output head (as LLaMA-Factory does for a resized vocabulary) and peft's `bias` ("lora_only",
"all"), resolved by `engine.models.peft.peft_full_paths` to the exact parameters that then train.

LoRA (Burn's): every float parameter is frozen; each rank-2 float parameter in the group gets
factors `a` [d_in, rank] and `b` [rank, d_out], trainable (DoRA adds a magnitude per output
column). The preview is the engine's (`Lora.preview`: what attaching would add and leave
trainable, adapters attached before included), from shapes: it never touches a value, and this
dialog computes none of it itself.
"""
from __future__ import annotations

import math
from typing import Any

from PySide6.QtCore import Signal
import re

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox, QLabel,
                               QLineEdit, QVBoxLayout)

from engine.module import Lora, ParamGroup
from engine.module.nf4 import bits_per_weight
from engine.models import PretrainedError
from engine.models.peft import full_candidates, peft_full_paths, peft_targets, target_group

from .common import ErrorLabel, count, monospace_font
from .group_dialog import GroupSelector, fill_preview, preview_table, shape_text


VARIANTS = [("lora", "LoRA"), ("rslora", "rsLoRA (alpha / √rank)"), ("dora", "DoRA (+ magnitude per column)"),
            ("qlora", "QLoRA (4-bit NF4 base)")]
ALL_LINEAR = "all-linear"
GROUP_TARGETS = "group"  # the targets are the parameter group below
CUSTOM_TARGETS = "custom"
# the modules LLaMA-Factory trains whole for a resized vocabulary (input embedding, output head)
FULL_MODULES = ("embed_tokens", "wte", "word_embeddings", "lm_head")
BIAS_CHOICES = [("none", "none"), ("lora_only", "of the adapted modules (lora_only)"), ("all", "every bias (all)")]
# the attention and the experts of a mixture: Mixtral's experts are w1 / w2 / w3; a Qwen mixture's experts
# are gate_proj / up_proj / down_proj under `mlp.experts.<e>` (a regex, so that the dense layers' MLP and
# Qwen2-MoE's shared expert, which have the same names, are left out; full match on module names, as peft)
MIXTRAL_ATTENTION_EXPERTS = "q_proj, k_proj, v_proj, o_proj, w1, w2, w3"
QWEN_EXPERTS = r".*\.mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)"
QWEN_ATTENTION_EXPERTS = r".*\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj))"
_NAME_LIST = re.compile(r"^\s*[\w.-]+(\s*,\s*[\w.-]+)*\s*$")


def target_presets(module: Any) -> list[tuple[str, str]]:
    """(key, label) of the PEFT-style target presets that select something in `module`: the
    family's usual ones (Llama's, Qwen3's "q_proj, v_proj" and the four attention projections,
    GPT-2's "c_attn", Phi-3's fused "qkv_proj" and "gate_up_proj", a mixture's router "gate",
    Mixtral's experts "w1, w2, w3" and a Qwen mixture's routed experts, alone and with the attention),
    "all-linear", a custom list or
    regex, and the parameter group."""
    try:
        targets = peft_targets(module)
        names = {t.module.rpartition(".")[2] for t in targets}
        linear = any(t.kind == "linear" for t in targets)
        # a Qwen mixture's routed experts: gate_proj / up_proj / down_proj under `experts.<e>` (its dense
        # layers and Qwen2-MoE's shared expert have the same names outside it)
        experts = any(t.module.endswith(".gate_proj") and ".experts." in t.module for t in targets)
    except Exception:  # noqa: BLE001 - a model the rules cannot read keeps the group
        names, linear, experts = set(), False, False
    out = []
    if {"q_proj", "v_proj"} <= names:
        out.append(("q_proj, v_proj", "q_proj, v_proj (PEFT's default for Llama, Mistral, Qwen2, Gemma)"))
    if {"q_proj", "k_proj", "v_proj", "o_proj"} <= names:
        out.append(("q_proj, k_proj, v_proj, o_proj", "q_proj, k_proj, v_proj, o_proj"))
    if "c_attn" in names:
        out.append(("c_attn", "c_attn (GPT-2's attention)"))
    if {"query", "value"} <= names:
        out.append(("query, value", "query, value (PEFT's default for BERT and ViT)"))
    if {"qkv_proj", "o_proj"} <= names:  # Phi-3: q, k, v fused in one Linear (one LoRA over its rows, as peft)
        out.append(("qkv_proj", "qkv_proj (Phi-3's fused attention)"))
        out.append(("qkv_proj, o_proj", "qkv_proj, o_proj"))
    if {"gate_up_proj", "down_proj"} <= names:
        out.append(("gate_up_proj, down_proj", "gate_up_proj, down_proj (Phi-3's MLP)"))
    if {"q_proj", "k_proj", "v_proj", "o_proj", "gate"} <= names:  # a mixture of experts' router
        out.append(("q_proj, k_proj, v_proj, o_proj, gate", "q_proj, k_proj, v_proj, o_proj, gate (the attention "
                                                            "and the experts' router)"))
    if {"w1", "w2", "w3"} <= names:
        out.append(("w1, w2, w3", "w1, w2, w3 (Mixtral's experts)"))
        out.append((MIXTRAL_ATTENTION_EXPERTS, "q_proj, k_proj, v_proj, o_proj, w1, w2, w3 (the attention and "
                                               "Mixtral's experts)"))
    if experts and {"q_proj", "k_proj", "v_proj", "o_proj"} <= names:
        out.append((QWEN_EXPERTS, "the routed experts' gate_proj, up_proj, down_proj (Qwen2-MoE's, Qwen3-MoE's "
                                  "experts)"))
        out.append((QWEN_ATTENTION_EXPERTS, "q_proj, k_proj, v_proj, o_proj and the routed experts' projections "
                                            "(the attention and the experts)"))
    if linear:
        out.append((ALL_LINEAR, "all-linear (every Linear but the output head)"))
    out.append((CUSTOM_TARGETS, "Custom: module names or a regex"))
    out.append((GROUP_TARGETS, "Parameter group (below)"))
    return out


def peft_target_modules(text: str):
    """A custom target text as peft's `target_modules`: "q_proj, v_proj" -> a list of names,
    "all-linear" as it is, anything else a regex (full match on module names)."""
    t = text.strip()
    if t.lower() == "all-linear":
        return "all-linear"
    if _NAME_LIST.match(t):
        return [n.strip() for n in t.split(",")]
    return t


class LoraDialog(QDialog):
    """Emits `lora_chosen(edit)` with `{"op": "lora", "rank", "alpha", "init_std", "group",
    "qlora", "variant"}` when accepted: the project file's JSON form of the edit, which the app
    reads into its typed schema (`app.core.schema.edit_from_json`; widgets do not import the
    app). PEFT-style targets are resolved here to the exact parameter paths they select
    (`{"kind": "paths"}`), so the edit replays the same selection."""

    lora_chosen = Signal(dict)

    def __init__(self, module: Any, parent=None, *, group_text: str = "", group_mode: str = "all"):
        super().__init__(parent)
        self.setWindowTitle("Attach LoRA")
        self.setObjectName("lora-dialog")
        self.params = module.named_params()
        self.module = module
        self._target_cache: dict[str, Any] = {}  # target text -> the parameters it selects, or the error
        self.variant = QComboBox()
        self.variant.setObjectName("variant")
        for key, label in VARIANTS:
            self.variant.addItem(label, key)
        self.variant.setToolTip("LoRA: scale alpha / rank. rsLoRA: alpha / sqrt(rank). DoRA: LoRA plus a trainable "
                                "magnitude per output column. QLoRA: LoRA over base weights packed to 4-bit NF4")
        self.targets = QComboBox()
        self.targets.setObjectName("targets")
        for key, label in target_presets(module):
            self.targets.addItem(label, key)
        self.targets.setToolTip("Which weights get adapters, by PEFT's target_modules rules on the module names")
        self.custom_targets = QLineEdit()
        self.custom_targets.setObjectName("custom-targets")
        self.custom_targets.setFont(monospace_font())
        self.custom_targets.setPlaceholderText(r"q_proj, k_proj   or   .*\.layers\.0\..*_proj")
        self.targets_error = ErrorLabel()
        # a subtree selected in the tree: the dialog starts on that parameter group; the whole
        # model: on the family's preset (PEFT's default targets) where it has one, for the group
        # "all" would adapt every rank-2 weight, the embeddings and the output head included
        family = self.targets.itemData(0) not in (ALL_LINEAR, CUSTOM_TARGETS, GROUP_TARGETS)
        whole = group_mode == "all" and not group_text.strip()
        self.targets.setCurrentIndex(0 if family and whole else self.targets.count() - 1)
        self.rank = self._field("rank", "8", "the adapters' inner dimension, an integer ≥ 1")
        self.rank_error = ErrorLabel()
        # a rank that is not below a target's smaller side makes no low-rank update: warned, allowed
        self.rank_warning = QLabel()
        self.rank_warning.setObjectName("rank-warning")
        self.rank_warning.setWordWrap(True)
        self.rank_warning.setStyleSheet("color: #b36b00;")
        self.rank_warning.hide()
        self.alpha = self._field("alpha", "16", "scale: the update is (alpha / rank) · a @ b")
        self.alpha_error = ErrorLabel()
        self.init_std = self._field("init_std", "", "std of a's normal init; empty: 1 / rank")
        self.init_std.setPlaceholderText("1 / rank")
        self.init_std_error = ErrorLabel()
        self.group = GroupSelector(mode=group_mode, text=group_text)
        self.qlora = QCheckBox("QLoRA: pack the base weights to 4-bit NF4")
        self.qlora.setObjectName("qlora")
        self.block_size = self._field("block_size", "64", "values per quantization block (absmax scale each)")
        self.block_size_error = ErrorLabel()
        self.double_quant = QCheckBox("Double quantization of the block scales")
        self.double_quant.setObjectName("double_quant")
        self.double_quant.setChecked(True)
        try:
            leaves, has_bias = full_candidates(module)
        except Exception:  # noqa: BLE001 - a model the weight map cannot name offers nothing to train fully
            leaves, has_bias = [], False
        self.full_modules: dict[str, QCheckBox] = {}
        for leaf in (n for n in FULL_MODULES if n in leaves):
            box = QCheckBox(leaf)
            box.setObjectName(f"train-fully-{leaf}")
            box.setToolTip(f"train '{leaf}' whole beside the adapters (peft's modules_to_save), e.g. for a resized "
                           f"vocabulary")
            self.full_modules[leaf] = box
        self.bias = QComboBox()
        self.bias.setObjectName("bias")
        for key, label in BIAS_CHOICES:
            self.bias.addItem(label, key)
        self.bias.setEnabled(has_bias)
        self.bias.setToolTip("which biases train beside the adapters (peft's bias)" if has_bias else
                             "this model has no biases")
        self.full_error = ErrorLabel()
        self.summary = QLabel("")
        self.summary.setObjectName("summary")
        self.summary.setWordWrap(True)
        self.preview = preview_table(["Parameter", "Shape", "a", "b", "Added"])
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)

        form = QFormLayout()
        form.addRow("Variant", self.variant)
        form.addRow("Rank", self.rank)
        form.addRow("", self.rank_error)
        form.addRow("", self.rank_warning)
        form.addRow("Alpha", self.alpha)
        form.addRow("", self.alpha_error)
        form.addRow("Init std", self.init_std)
        form.addRow("", self.init_std_error)
        form.addRow("Targets", self.targets)
        form.addRow("", self.custom_targets)
        form.addRow("", self.targets_error)
        form.addRow("Parameters", self.group)
        qbox = QGroupBox("Quantization")
        qform = QFormLayout(qbox)
        qform.addRow(self.qlora)
        qform.addRow("Block size", self.block_size)
        qform.addRow("", self.block_size_error)
        qform.addRow(self.double_quant)
        fbox = QGroupBox("Also train fully (PEFT modules_to_save and bias)")
        fbox.setObjectName("train-fully")
        fform = QFormLayout(fbox)
        for box in self.full_modules.values():
            fform.addRow(box)
        fform.addRow("Biases", self.bias)
        fform.addRow("", self.full_error)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(fbox)
        layout.addWidget(qbox)
        layout.addWidget(self.summary)
        layout.addWidget(self.preview, 1)
        layout.addWidget(self.buttons)
        self.resize(680, 620)
        for w in (self.rank, self.alpha, self.init_std, self.block_size):
            w.textChanged.connect(self._update)
        self.group.changed.connect(self._on_group_edited)
        self.qlora.toggled.connect(self._on_qlora_toggled)
        self.variant.currentIndexChanged.connect(self._on_variant)
        self.targets.currentIndexChanged.connect(self._update)
        self.custom_targets.textChanged.connect(self._update)
        self.double_quant.toggled.connect(self._update)
        for box in self.full_modules.values():
            box.toggled.connect(self._update)
        self.bias.currentIndexChanged.connect(self._update)
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        self._edit: dict | None = None
        self._update()

    def _field(self, name: str, text: str, tip: str) -> QLineEdit:
        w = QLineEdit(text)
        w.setObjectName(name)
        w.setToolTip(tip)
        w.setFont(monospace_font())
        return w

    def _on_variant(self, *_):
        quant = self.variant.currentData() == "qlora"
        if self.qlora.isChecked() != quant:
            self.qlora.setChecked(quant)  # updates through _on_qlora_toggled
        else:
            self._update()

    def _on_qlora_toggled(self, on: bool) -> None:
        if on and self.variant.currentData() != "qlora":
            self.variant.setCurrentIndex([k for k, _ in VARIANTS].index("qlora"))
        elif not on and self.variant.currentData() == "qlora":
            self.variant.setCurrentIndex(0)
        self._update()

    def _on_group_edited(self) -> None:
        """Editing the parameter group makes it the targets."""
        i = self.targets.findData(GROUP_TARGETS)
        if self.targets.currentIndex() != i:
            self.targets.setCurrentIndex(i)  # updates through currentIndexChanged
        else:
            self._update()

    def set_targets(self, key: str, custom: str = "") -> None:
        """Choose a target preset by key ("q_proj, v_proj", "all-linear", "custom", "group")."""
        if custom:
            self.custom_targets.setText(custom)
        i = self.targets.findData(key)
        if i < 0:
            raise ValueError(f"no target preset {key!r}: expected one of "
                             f"{[self.targets.itemData(j) for j in range(self.targets.count())]}")
        self.targets.setCurrentIndex(i)

    def set_variant(self, key: str) -> None:
        self.variant.setCurrentIndex([k for k, _ in VARIANTS].index(key))

    def _selected(self):
        """(the parameters the targets select or None, the group's JSON form)."""
        key = self.targets.currentData()
        self.custom_targets.setVisible(key == CUSTOM_TARGETS)
        if key == GROUP_TARGETS:
            self.targets_error.show_error(None)
            return self.group.select(self.params), self.group.spec()
        self.group.error.show_error(None)
        text = self.custom_targets.text() if key == CUSTOM_TARGETS else key
        if not text.strip():
            self.targets_error.show_error("type module names (q_proj, v_proj), a regex, or all-linear")
            return None, None
        found = self._target_cache.get(text)
        if found is None:  # the rules walk the model once per target text, not once per keystroke elsewhere
            try:
                group = target_group(self.module, peft_target_modules(text))
                found = [(p, v) for p, v in self.params if group.matches(v.id, p)]
            except ValueError as e:  # the rules' message: what matched nothing, the names the model has
                found = str(e)
            self._target_cache[text] = found
        if isinstance(found, str):
            self.targets_error.show_error(found)
            return None, None
        self.targets_error.show_error(None)
        return found, {"kind": "paths", "paths": [p for p, _ in found]}

    def ok_button(self):
        return self.buttons.button(QDialogButtonBox.StandardButton.Ok)

    # ---- validation ----------------------------------------------------------------------
    @staticmethod
    def _int(text: str, what: str, minimum: int) -> tuple[int | None, str | None]:
        t = text.strip()
        try:
            v = int(t)
        except ValueError:
            return None, f"{what} must be a whole number ≥ {minimum}, got {t!r}" if t else f"{what} is required"
        if v < minimum:
            return None, f"{what} must be ≥ {minimum}, got {v}"
        return v, None

    @staticmethod
    def _float(text: str, what: str, positive: bool) -> tuple[float | None, str | None]:
        t = text.strip()
        try:
            v = float(t)
        except ValueError:
            return None, f"{what} must be a number, got {t!r}" if t else f"{what} is required"
        if not math.isfinite(v):
            return None, f"{what} must be finite, got {t}"
        if positive and v <= 0:
            return None, f"{what} must be > 0, got {t}"
        return v, None

    def _update(self, *_):
        ok = True
        rank, err = self._int(self.rank.text(), "rank", 1)
        self.rank_error.show_error(err)
        ok &= err is None
        alpha, err = self._float(self.alpha.text(), "alpha", positive=False)
        self.alpha_error.show_error(err)
        ok &= err is None
        init_std = None
        if self.init_std.text().strip():
            init_std, err = self._float(self.init_std.text(), "init std", positive=True)
        else:
            err = None
        self.init_std_error.show_error(err)
        ok &= err is None
        quant = self.qlora.isChecked()
        self.block_size.setEnabled(quant)
        self.double_quant.setEnabled(quant)
        block = 64
        if quant:
            block, err = self._int(self.block_size.text(), "block size", 2)
            if err is None and block % 2:
                err = f"block size must be even (two 4-bit codes a byte), got {block}"
            self.block_size_error.show_error(err)
            ok &= err is None
        else:
            self.block_size_error.show_error(None)
        matches, group_spec = self._selected()
        variant = self.variant.currentData()
        if variant == "dora" and quant:  # pragma: no cover - the combo makes them exclusive
            variant = "lora"
        # the engine's preview of attaching the variant to the selected parameters: which get
        # factors, how many values they add, what stays trainable (adapters attached before too)
        lora = Lora(rank if rank is not None else 1, 1.0, use_dora=variant == "dora", use_rslora=variant == "rslora",
                    param_group=ParamGroup.from_ids([v.id for _p, v in matches or []]))
        preview = lora.preview(self.module)
        targets = preview.targets
        nested = [p for p, _ in preview.nested]
        if nested:
            self.group.error.show_error(
                f"{len(nested)} selected weight(s) already have LoRA ({nested[0]}, …): reparameterizations do not "
                f"nest; detach or materialize them first, or select weights without LoRA")
            targets = []
        elif matches is not None and not targets:
            self.group.error.show_error("none of the selected parameters is a rank-2 float weight; "
                                        "LoRA attaches to matrices")
        ok &= bool(targets)
        full_spec, full_values = self._train_fully(targets)
        ok &= not self.full_error.error()
        self.ok_button().setEnabled(ok)
        self._warn_rank(rank, targets)
        if rank is not None and targets:
            added, after = preview.added, preview.counts
            pv = {"added": added, "trainable": after.trainable, "all": after.total, "percent": after.percent,
                  "targets": len(targets)}
            label = {"rslora": "rsLoRA", "dora": "DoRA", "qlora": "QLoRA"}.get(variant, "LoRA")
            text = f"{label} on {len(targets)} weight(s) adds {count(added)} parameters. After: {after}"
            if quant and block is not None:
                bits = bits_per_weight(block, self.double_quant.isChecked())
                text += f". Base weights packed to NF4, about {bits:.3f} bits per weight."
            if full_spec is not None:
                text += (f". Trained fully beside the adapters: {len(full_spec['paths'])} parameter(s), "
                         f"{count(full_values)} values.")
            self.summary.setText(text)
            # a later part of a fused module shares the first part's `a`: it adds only its `b`
            shared = preview.shared
            fill_preview(self.preview, [(p, shape_text(v.shape),
                                         f"{shared[p].rsplit('.', 2)[-2]}'s" if p in shared else shape_text([v.shape[0], rank]),
                                         shape_text([rank, v.shape[1]]),
                                         count(lora.factor_count(v, p) - (v.shape[0] * rank if p in shared else 0)))
                                        for p, v in targets])
            for r in range(self.preview.rowCount()):
                path = targets[r][0]
                if path in shared:
                    self.preview.item(r, 2).setToolTip(f"{path} shares the a factor of {shared[path]} (one parameter)")
            self.preview_counts = pv
        else:
            self.summary.setText("")
            fill_preview(self.preview, [])
            self.preview_counts = None
        ok &= group_spec is not None
        self.ok_button().setEnabled(ok)
        self._edit = {"op": "lora", "rank": rank, "alpha": alpha, "init_std": init_std,
                      "group": group_spec,
                      "qlora": {"block_size": block, "double_quant": self.double_quant.isChecked()} if quant else None,
                      **({"variant": variant} if variant in ("rslora", "dora") else {}),
                      **({"train_fully": full_spec} if full_spec is not None else {})
                      } if ok else None

    def _train_fully(self, targets) -> tuple[dict | None, int]:
        """(the group of the parameters "Also train fully" selects, their value count), the engine's
        selection for these targets (`peft_full_paths`); a refusal (a tied head) shown beside it."""
        chosen = [leaf for leaf, box in self.full_modules.items() if box.isChecked()]
        bias = self.bias.currentData()
        if not chosen and bias == "none":
            self.full_error.show_error(None)
            return None, 0
        try:
            paths = peft_full_paths(self.module, chosen, bias, [p for p, _ in targets or []])
        except (PretrainedError, ValueError) as e:
            self.full_error.show_error(str(e))
            return None, 0
        if not paths:
            self.full_error.show_error(f"bias {bias!r}: the adapted modules have no biases")
            return None, 0
        self.full_error.show_error(None)
        shapes = dict(self.params)
        return {"kind": "paths", "paths": paths}, sum(math.prod(shapes[p].shape) for p in paths if p in shapes)

    def _warn_rank(self, rank: int | None, targets) -> None:
        """Warn when the rank is at least min(d_in, d_out) of a target: its factors hold as many
        values as the weight or more, and the update is not low-rank."""
        full = [(p, v.shape) for p, v in (targets or []) if rank is not None and rank >= min(v.shape[0], v.shape[1])]
        if not full:
            self.rank_warning.clear()
            self.rank_warning.hide()
            return
        p, shape = full[0]
        more = f" (and {len(full) - 1} more)" if len(full) > 1 else ""
        self.rank_warning.setText(f"rank {rank} is not below min(d_in, d_out) = {min(shape[0], shape[1])} of {p} "
                                  f"{shape_text(shape)}{more}: the adapters are no smaller than the weight and the "
                                  f"update is not low-rank; choose a rank below {min(shape[0], shape[1])}")
        self.rank_warning.show()

    def edit(self) -> dict | None:
        return self._edit

    def errors(self) -> list[str]:
        return [e.error() for e in (self.rank_error, self.alpha_error, self.init_std_error, self.block_size_error,
                                    self.targets_error, self.group.error, self.full_error) if e.error()]

    def _accept(self) -> None:
        if self._edit is None:
            return
        self.lora_chosen.emit(dict(self._edit))
        self.accept()
