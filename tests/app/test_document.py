"""The Document and its undo stack: commands swap module values, edits and contracts are
derived from what is applied, projects are written atomically and validated on reading."""
import json

import pytest

from app.core.schema import (ExampleSource, GroupEdit, GroupSpec, LoraEdit, MaterializeEdit, MoveEdit, Project,
                             RunRecord, edit_from_json)
from app.core.project import ProjectError, project_data_at, read_project
from app.document import Document


class Value:
    """A stand-in module value: the document never looks inside the module."""

    def __init__(self, name):
        self.name = name


def test_commands_swap_values_without_copying(qtbot):
    doc = Document()
    a, b, c = Value("a"), Value("b"), Value("c")
    doc.set_model(a, ExampleSource("x"))
    changes = []
    doc.model_changed.connect(lambda: changes.append(doc.module))
    doc.push_module("Freeze", b, GroupEdit("freeze", GroupSpec("all")))
    doc.push_module("Fork", c, MoveEdit("cpu:1", fork=True))
    assert doc.module is c
    doc.undo_stack.undo()
    assert doc.module is b
    doc.undo_stack.undo()
    assert doc.module is a
    doc.undo_stack.redo()
    assert doc.module is b
    assert changes == [b, c, b, a, b]
    assert doc.edits == [GroupEdit("freeze", GroupSpec("all"))]


def test_dirty_follows_the_undo_stack(qtbot):
    doc = Document()
    doc.set_model(Value("a"), ExampleSource("x"))
    seen = []
    doc.dirty_changed.connect(seen.append)
    assert not doc.is_dirty()
    doc.push_module("edit", Value("b"), MaterializeEdit())
    assert doc.is_dirty() and doc.title.endswith("*")
    doc.undo_stack.undo()
    assert not doc.is_dirty()
    assert seen == [True, False]


def test_contract_edits_are_undoable_and_saved(qtbot, tmp_path):
    doc = Document()
    doc.set_model(Value("a"), ExampleSource("mnist"))
    doc.set_contract("fc1", "[batch, 1600] -> [batch, 128]")
    doc.set_contract("", "[batch, 28, 28] -> [batch, 10]")
    assert doc.contracts == {"fc1": "[batch, 1600] -> [batch, 128]", "": "[batch, 28, 28] -> [batch, 10]"}
    doc.undo_stack.undo()
    assert "" not in doc.contracts
    path = doc.save_project(tmp_path / "p")
    assert path.name == "p.ember.json"
    project = read_project(path)
    assert project.contracts == {"fc1": "[batch, 1600] -> [batch, 128]"}
    assert project.source == ExampleSource("mnist")
    assert not doc.is_dirty() and doc.project_path == path


def test_saving_replaces_the_file_atomically(qtbot, tmp_path):
    doc = Document()
    doc.set_model(Value("a"), ExampleSource("x"))
    path = doc.save_project(tmp_path / "m.ember.json")
    doc.push_module("Freeze", Value("b"), GroupEdit("freeze", GroupSpec("all")))
    doc.save_project(path)
    assert json.loads(path.read_text())["edits"] == [{"op": "freeze", "group": {"kind": "all"}}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ember.json"]  # no temporary left


def test_base_edits_come_before_the_applied_commands(qtbot):
    doc = Document()
    doc.set_model(Value("a"), ExampleSource("x"), edits=[MaterializeEdit()])
    doc.push_module("Fork", Value("b"), MoveEdit("cpu:1", fork=True))
    assert doc.edits == [MaterializeEdit(), MoveEdit("cpu:1", fork=True)]
    doc.set_model(Value("c"), ExampleSource("y"))
    assert doc.edits == [] and doc.undo_stack.count() == 0


@pytest.mark.parametrize("content, message", [
    ("not json", "expected JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"format": 7, "source": {"kind": "example"}}', "format: expected project format 1, found 7"),
    ('{"format": 1, "source": "mnist"}', "project.source: expected a source object, found 'mnist'"),
    ('{"format": 1, "source": {"kind": "example"}}', r"source.name: expected an example name \(string\), found nothing"),
    ('{"format": 1, "source": {"kind": "example", "name": "x"}, "edits": {}}',
     r"project.edits: expected a list of edits, found \{\}"),
    ('{"format": 1, "source": {"kind": "example", "name": "x"}, "edits": [{"op": "lora", "rank": "8"}]}',
     r"edits\[0\].rank: expected an int, found '8'"),
    ('{"format": 1, "source": {"kind": "example", "name": "x"}, "edits": [{"op": "explode"}]}',
     r"edits\[0\].op: expected one of freeze, unfreeze, no_grad, lora, materialize, detach, fork, to_device, load, peft, "
     r"found 'explode'"),
    ('{"format": 1, "source": {"kind": "script", "path": "m.py"}, "runs": [{"name": "1"}]}',
     r"runs\[0\].folder: expected a folder path \(string\), found nothing"),
])
def test_a_bad_project_file_says_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.ember.json"
    path.write_text(content)
    with pytest.raises(ProjectError, match=message) as info:
        read_project(path)
    assert str(path) in str(info.value)


PROJECT = {"format": 1, "application": "ember",
           "source": {"kind": "checkpoint", "path": "w.bpk", "architecture": {"kind": "script", "path": "/m.py",
                                                                               "factory": "make"},
                      "allow_partial": True},
           "edits": [{"op": "freeze", "group": {"kind": "regex", "pattern": "^encoder\\."}},
                     {"op": "no_grad", "group": {"kind": "paths", "paths": ["a.weight", "b.bias"]}},
                     {"op": "unfreeze", "group": {"kind": "predicate", "text": "attn"}},
                     {"op": "lora", "rank": 8, "alpha": 16.0, "init_std": None, "group": {"kind": "path", "path": "fc1.weight"},
                      "qlora": {"block_size": 32, "double_quant": False}},
                     {"op": "materialize"}, {"op": "fork", "device": "cpu:1"}, {"op": "to_device", "device": "cpu"},
                     {"op": "load", "path": "/w.bpk", "allow_partial": False}],
           "contracts": {"": "[batch, 784] -> [batch, 10]"},
           "runs": [{"name": "1: spirals", "folder": "/runs/1", "status": "finished", "global_step": 50, "epoch": 2}]}


def read_project_data_paths(data: dict, folder) -> list[str]:
    """The load edit's and the run's paths of project JSON `data`, resolved against `folder`."""
    import os

    return [os.path.normpath(os.path.join(folder, p)) for p in (data["edits"][-1]["path"], data["runs"][0]["folder"])]


def test_a_project_reads_into_typed_values_and_writes_the_same_json(tmp_path):
    path = tmp_path / "p.ember.json"
    path.write_text(json.dumps(PROJECT))
    project = read_project(path)
    assert project.edits[3] == LoraEdit(8, 16.0, None, GroupSpec("path", path="fc1.weight"), project.edits[3].qlora)
    assert project.edits[3].qlora.block_size == 32 and project.runs == [RunRecord("1: spirals", "/runs/1", "finished",
                                                                                  50, 2)]
    # relative paths are read against the project's folder and written back relative to it
    assert project.source.path == str(tmp_path / "w.bpk")
    data = project_data_at(project, path)
    assert data["source"]["path"] == "w.bpk"
    assert data["contracts"] == PROJECT["contracts"] and data["edits"][:-1] == PROJECT["edits"][:-1]
    assert read_project_data_paths(data, tmp_path) == ["/w.bpk", "/runs/1"]  # absolute ones point where they did
    assert Project.from_json(project.to_json()) == project
    assert edit_from_json({"op": "lora", "rank": 4, "alpha": 8, "group": {"kind": "all"}}).to_json()["alpha"] == 8.0


def test_recording_a_run_replaces_its_folder_signals_and_makes_the_document_dirty(qtbot):
    doc = Document()
    doc.set_model(Value("a"), ExampleSource("x"))
    seen = []
    doc.runs_changed.connect(lambda: seen.append(list(doc.runs)))
    doc.record_run(RunRecord("1", "/r/1", "running"))
    doc.record_run(RunRecord("2", "/r/2", "running"))
    doc.record_run(RunRecord("1", "/r/1", "finished", 10, 1))
    assert doc.runs == [RunRecord("1", "/r/1", "finished", 10, 1), RunRecord("2", "/r/2", "running")]
    assert len(seen) == 3 and doc.is_dirty()
    assert doc.project_data()["runs"][0] == {"name": "1", "folder": "/r/1", "status": "finished", "global_step": 10,
                                             "epoch": 1}
