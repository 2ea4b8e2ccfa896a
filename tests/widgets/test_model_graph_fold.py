"""The model graph folds a run of identical blocks into one box "× N" that expands (issue 48,
item 14): a Llama's decoder layers, an MLP's equal hidden blocks; blocks that differ stay apart."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from engine import Tensor
from engine.interop import trace_model
from engine.models import from_pretrained
from engine.module import Module
from tests.widgets.models import Block
from widgets.model_graph import ModelGraphView

LLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama-gqa"


class Stack(Module):
    """An input block, three equal hidden blocks, a narrower one, three equal blocks again."""

    def __init__(self):
        self.blocks = [Block(8, 16), Block(16, 16), Block(16, 16), Block(16, 16), Block(16, 4), Block(4, 4),
                       Block(4, 4)]

    def forward(self, x):
        for b in self.blocks:
            x = b.forward(x)
        return x


@pytest.fixture
def view(qtbot):
    v = ModelGraphView()
    qtbot.addWidget(v)
    v.resize(600, 800)
    v.show()
    return v


def labels(view) -> list[str]:
    return [box.unit.label for box in sorted(view.boxes.values(), key=lambda b: b.pos().y())]


def test_equal_blocks_fold_into_one_box_that_expands(view, qtbot):
    view.set_trace(trace_model(Stack(), [Tensor.from_data(np.ones((2, 8), np.float32))]))
    shown = labels(view)
    assert shown[1:-1] == ["0 · Block", "blocks.1–3 · Block × 3", "4 · Block", "blocks.5–6 · Block × 2"], shown
    fold = view.boxes["repeat:blocks.1"]
    assert fold.unit.expandable and fold.text.text().startswith("+ ")
    view.select_path("blocks.2.linear")
    assert view.highlighted() == "repeat:blocks.1"  # the fold holds the selection
    view.expand("repeat:blocks.1")
    shown = labels(view)
    assert shown[2:6] == ["blocks.1–3 · Block × 3", "1 · Block", "2 · Block", "3 · Block"]
    assert view.highlighted() == "blocks.2"  # the innermost box shown
    view.expand("blocks.2")
    assert "linear · Linear" in labels(view)
    # the edges still carry the shapes passed between the boxes
    assert "[2, 16]" in view.texts() and "[2, 4]" in view.texts()
    activated = []
    view.module_activated.connect(activated.append)
    view.collapse("repeat:blocks.1")
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                     pos=view.mapFromScene(view.boxes["repeat:blocks.1"].sceneBoundingRect().center()))
    assert activated == ["blocks"]  # a fold selects the list of its blocks in the module tree


def test_a_llamas_decoder_layers_are_one_box(view):
    model = from_pretrained(LLAMA)
    ids = np.load(LLAMA / "expected.npz")["input_ids"]
    view.set_trace(trace_model(model, [Tensor.from_data(ids)], shape_only=True))
    shown = labels(view)
    assert "layers.0–1 · LlamaDecoderLayer × 2" in shown, shown
    assert not any(s.startswith("0 · LlamaDecoderLayer") for s in shown)
    view.expand("repeat:layers.0")
    assert {"0 · LlamaDecoderLayer", "1 · LlamaDecoderLayer"} <= set(labels(view))
