"""The Document and its undo stack: commands swap module values, edits and contracts are
derived from what is applied, projects are written atomically and validated on reading."""
import json

import pytest

from app.document import Document, ProjectError, read_project


class Value:
    """A stand-in module value: the document never looks inside the module."""

    def __init__(self, name):
        self.name = name


def test_commands_swap_values_without_copying(qtbot):
    doc = Document()
    a, b, c = Value("a"), Value("b"), Value("c")
    doc.set_model(a, {"kind": "example", "name": "x"})
    changes = []
    doc.model_changed.connect(lambda: changes.append(doc.module))
    doc.push_module("Freeze", b, {"op": "freeze", "group": {"kind": "all"}})
    doc.push_module("Fork", c, {"op": "fork", "device": "cpu:1"})
    assert doc.module is c
    doc.undo_stack.undo()
    assert doc.module is b
    doc.undo_stack.undo()
    assert doc.module is a
    doc.undo_stack.redo()
    assert doc.module is b
    assert changes == [b, c, b, a, b]
    assert doc.edits == [{"op": "freeze", "group": {"kind": "all"}}]


def test_dirty_follows_the_undo_stack(qtbot):
    doc = Document()
    doc.set_model(Value("a"), {"kind": "example", "name": "x"})
    seen = []
    doc.dirty_changed.connect(seen.append)
    assert not doc.is_dirty()
    doc.push_module("edit", Value("b"), {"op": "materialize"})
    assert doc.is_dirty() and doc.title.endswith("*")
    doc.undo_stack.undo()
    assert not doc.is_dirty()
    assert seen == [True, False]


def test_contract_edits_are_undoable_and_saved(qtbot, tmp_path):
    doc = Document()
    doc.set_model(Value("a"), {"kind": "example", "name": "mnist"})
    doc.set_contract("fc1", "[batch, 1600] -> [batch, 128]")
    doc.set_contract("", "[batch, 28, 28] -> [batch, 10]")
    assert doc.contracts == {"fc1": "[batch, 1600] -> [batch, 128]", "": "[batch, 28, 28] -> [batch, 10]"}
    doc.undo_stack.undo()
    assert "" not in doc.contracts
    path = doc.save_project(tmp_path / "p")
    assert path.name == "p.ember.json"
    data = read_project(path)
    assert data["contracts"] == {"fc1": "[batch, 1600] -> [batch, 128]"}
    assert data["source"] == {"kind": "example", "name": "mnist"}
    assert not doc.is_dirty() and doc.project_path == path


def test_saving_replaces_the_file_atomically(qtbot, tmp_path):
    doc = Document()
    doc.set_model(Value("a"), {"kind": "example", "name": "x"})
    path = doc.save_project(tmp_path / "m.ember.json")
    doc.push_module("Freeze", Value("b"), {"op": "freeze", "group": {"kind": "all"}})
    doc.save_project(path)
    assert json.loads(path.read_text())["edits"] == [{"op": "freeze", "group": {"kind": "all"}}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ember.json"]  # no temporary left


def test_base_edits_come_before_the_applied_commands(qtbot):
    doc = Document()
    doc.set_model(Value("a"), {"kind": "example", "name": "x"}, edits=[{"op": "materialize"}])
    doc.push_module("Fork", Value("b"), {"op": "fork", "device": "cpu:1"})
    assert doc.edits == [{"op": "materialize"}, {"op": "fork", "device": "cpu:1"}]
    doc.set_model(Value("c"), {"kind": "example", "name": "y"})
    assert doc.edits == [] and doc.undo_stack.count() == 0


@pytest.mark.parametrize("content, message", [
    ("not json", "expected JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"format": 7, "source": {"kind": "example"}}', "expected project format 1, found 7"),
    ('{"format": 1, "source": "mnist"}', "'source' must be an object"),
    ('{"format": 1, "source": {"kind": "example"}, "edits": {}}', "'edits' must be a list"),
])
def test_a_bad_project_file_says_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.ember.json"
    path.write_text(content)
    with pytest.raises(ProjectError, match=message) as info:
        read_project(path)
    assert str(path) in str(info.value)
