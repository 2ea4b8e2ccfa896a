"""The module tree: lazy rows, counts, tri-state trainable checkboxes, LoRA badge, filter, depth."""
from PySide6.QtCore import QModelIndex, Qt

from engine.module import ParamGroup
from tests.widgets.models import Mlp, Wide, mlp_param_count
from widgets.module_tree import DEVICE, NAME, PARAMS, TRAINABLE, TYPE, ModuleTree, ModuleTreeModel


def row_texts(model, parent=QModelIndex()):
    return [model.index(r, NAME, parent).data() for r in range(model.rowCount(parent))]


def test_the_model_passes_qts_model_tester(qtmodeltester):
    model = ModuleTreeModel()
    model.set_module(Mlp())
    qtmodeltester.check(model, force_py=True)


def test_rows_are_created_only_when_a_branch_is_fetched(qtbot):
    model = ModuleTreeModel()
    model.set_module(Wide(500))
    assert model.rowCount() == 1
    root = model.index(0, 0)
    assert model.hasChildren(root) and model.rowCount(root) == 0 and model.canFetchMore(root)
    model.fetchMore(root)
    layers = model.index(0, 0, root)
    assert layers.data() == "layers" and layers.siblingAtColumn(TYPE).data() == "Vec[500]"
    assert sum(1 for _ in model.fetched_nodes()) == 2  # the model and its list, not 500 rows
    model.fetchMore(layers)
    assert model.rowCount(layers) == 500


def test_columns_show_counts_type_device_and_trainable_state(qtbot):
    model = ModuleTreeModel()
    m = Mlp()
    model.set_module(m)
    root = model.index(0, 0)
    assert root.data() == "Mlp"
    assert root.siblingAtColumn(PARAMS).data() == f"{mlp_param_count():,}"
    assert root.siblingAtColumn(DEVICE).data() == "cpu"
    assert root.siblingAtColumn(TRAINABLE).data(Qt.ItemDataRole.CheckStateRole) == Qt.CheckState.Checked
    model.fetchMore(root)
    assert row_texts(model, root) == ["blocks", "head", "scale", "dropout"]
    head = model.index_of("head")
    assert head.siblingAtColumn(TYPE).data() == "Linear"
    assert head.siblingAtColumn(PARAMS).data() == "51"
    weight = model.index_of("head.weight")
    assert weight.siblingAtColumn(TYPE).data() == "Param float[16, 3]"
    # nothing was initialized to show any of this
    assert not any(p.is_initialized() for _, p in m.named_params() if _ != "scale")


def test_tri_state_follows_the_engine_and_a_click_only_asks(qtbot):
    model = ModuleTreeModel()
    m = Mlp().freeze_group(ParamGroup.from_regex(r"^blocks\.0\."))
    model.set_module(m)
    state = lambda path: model.index_of(path).siblingAtColumn(TRAINABLE).data(Qt.ItemDataRole.CheckStateRole)
    assert state("") == Qt.CheckState.PartiallyChecked
    assert state("blocks") == Qt.CheckState.PartiallyChecked
    assert state("blocks.0") == Qt.CheckState.Unchecked
    assert state("blocks.1") == Qt.CheckState.Checked
    assert model.index_of("blocks.0").siblingAtColumn(TRAINABLE).data() == "0"
    assert model.index_of("blocks.1").siblingAtColumn(TRAINABLE).data() == f"{16 * 16 + 16:,}"
    asked = []
    model.trainable_toggled.connect(lambda p, t: asked.append((p, t)))
    assert model.setData(model.index_of("blocks.0").siblingAtColumn(TRAINABLE), Qt.CheckState.Checked,
                         Qt.ItemDataRole.CheckStateRole)
    assert asked == [("blocks.0", True)]
    assert state("blocks.0") == Qt.CheckState.Unchecked  # unchanged until the app acts


def test_clicking_a_checkbox_in_the_view_emits_the_request(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.resize(900, 400)
    tree.show()
    tree.set_module(Mlp())
    tree.select_path("head")
    index = tree.model.index_of("head").siblingAtColumn(TRAINABLE)
    rect = tree.view.visualRect(index)
    check_pos = rect.topLeft() + type(rect.topLeft())(10, rect.height() // 2)
    with qtbot.waitSignal(tree.trainable_toggled) as blocker:
        qtbot.mouseClick(tree.view.viewport(), Qt.MouseButton.LeftButton, pos=check_pos)
    assert blocker.args == ["head", False]


def test_expansion_and_selection_survive_a_new_module_value(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    m = Mlp()
    tree.set_module(m)
    tree.select_path("blocks.1.linear")
    assert tree.view.isExpanded(tree.model.index_of("blocks.1"))
    tree.set_module(m.freeze_group(ParamGroup.all()))
    assert tree.selected_path() == "blocks.1.linear"
    assert tree.view.isExpanded(tree.model.index_of("blocks.1"))


def test_filter_shows_matches_with_their_ancestors(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_module(Mlp())
    qtbot.keyClicks(tree.filter_edit, "relu")
    m = tree.model
    assert row_texts(m, m.index(0, 0)) == ["blocks"]
    assert row_texts(m, m.index_of("blocks")) == ["0", "1"]
    assert row_texts(m, m.index_of("blocks.0")) == ["activation"]
    assert tree.view.isExpanded(m.index_of("blocks.0"))
    tree.filter_edit.clear()
    assert row_texts(m, m.index(0, 0)) == ["blocks", "head", "scale", "dropout"]


def test_expand_to_depth(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_module(Mlp())
    tree.depth_spin.setValue(2)
    m = tree.model
    assert tree.view.isExpanded(m.index_of("blocks"))
    assert tree.view.isExpanded(m.index_of("blocks.0"))
    assert not tree.view.isExpanded(m.index_of("blocks.0.linear"))
    tree.depth_spin.setValue(0)
    assert not tree.view.isExpanded(m.index_of("blocks"))


def test_context_menu_actions_emit_requests(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_module(Mlp())
    got = []
    tree.op_requested.connect(lambda op, p: got.append((op, p)))
    tree.lora_requested.connect(lambda p: got.append(("lora", p)))
    tree.contract_requested.connect(lambda p: got.append(("contract", p)))
    menu = tree.context_menu("blocks.0")
    for a in menu.actions():
        if a.objectName():
            a.trigger()
    assert got == [("freeze", "blocks.0"), ("unfreeze", "blocks.0"), ("no_grad", "blocks.0"), ("lora", "blocks.0"),
                   ("contract", "blocks.0")]
    assert "contract" not in [a.objectName() for a in tree.context_menu("head.weight").actions()]


def _mixture(n_experts):
    from engine.models.moe import MoeConfig, build  # noqa: PLC0415

    return build(MoeConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                           num_attention_heads=2, model_type="mixtral", num_experts=n_experts, num_experts_per_tok=2))


def test_a_layers_experts_are_one_collapsed_group_named_with_their_count(qtbot):
    tree = ModuleTree()
    qtbot.addWidget(tree)
    tree.set_module(_mixture(64))
    m = tree.model
    tree.depth_spin.setValue(4)  # model > layers > 0 > mlp > experts: open down to the experts' row
    experts = m.index_of("layers.0.mlp.experts")
    assert experts.data() == "experts (64)" and experts.siblingAtColumn(TYPE).data() == "Vec[64]"
    assert tree.view.isExpanded(m.index_of("layers.0.mlp")) and not tree.view.isExpanded(experts)
    assert m.index_of("layers").data() == "layers"  # the model's own list of layers is no group
    tree.expand_all()
    assert not tree.view.isExpanded(experts)
    assert sum(1 for n in m.fetched_nodes() if n.path.startswith("layers.0.mlp.experts.")) == 0  # no 64 rows
    tree.filter_edit.setText("experts.63.down_proj")  # a filter opens the group to show what matches
    assert tree.view.isExpanded(m.index_of("layers.0.mlp.experts"))
    assert m.index_of("layers.1.mlp.experts.63.down_proj").isValid()


def test_a_few_experts_read_as_a_plain_list(qtbot):
    model = ModuleTreeModel()
    model.set_module(_mixture(4))
    assert model.index_of("layers.0.mlp.experts").data() == "experts"


def test_a_parameter_shared_by_a_fused_modules_parts_is_counted_once_and_named_at_its_other_places(qtbot):
    """A LoRA on parts of one fused module (engine.module.lora's shared A): the `a` both parts hold is counted
    at its first path, and its other place says whose it is."""
    from tests.engine.module.test_lora_shared_a import D_IN, D_K, D_Q, RANK, _tied  # noqa: PLC0415

    model = ModuleTreeModel()
    tuned = _tied()
    model.set_module(tuned)
    first, other = model.index_of("q.weight.lora.a"), model.index_of("k.weight.lora.a")
    assert first.siblingAtColumn(PARAMS).data() == f"{D_IN * RANK}"
    assert other.siblingAtColumn(PARAMS).data() == "0"
    assert other.siblingAtColumn(TYPE).data() == f"Param float[{D_IN}, {RANK}] · shared with q.weight.lora.a"
    assert first.siblingAtColumn(TYPE).data() == f"Param float[{D_IN}, {RANK}]"
    added = D_IN * RANK + RANK * D_Q + RANK * D_K + D_IN * RANK + RANK * 2
    assert model.index(0, 0).siblingAtColumn(TRAINABLE).data() == f"{added:,}"
