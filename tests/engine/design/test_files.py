"""Design files: exact round trips, schema-1 migration, atomic saves, autosave listing."""
import json
import re
import os

import pytest

from engine.design import (SCHEMA_VERSION, Design, DesignFileError, analyze, design_source, list_autosaves,
                           mnist_design, read_design, residual_design, save_design, write_autosave)
from engine.design.files import discard_autosave


def test_a_design_file_round_trips_exactly(tmp_path):
    d = mnist_design()
    d.set_position("fc1", (12.5, -3.25))
    path = save_design(d, tmp_path / "mnist")
    assert path.name == "mnist.ember.json"
    text = path.read_text()
    data = json.loads(text)
    # an Ember project whose model comes from the design
    assert data["format"] == 1 and data["source"]["kind"] == "design"
    assert data["source"]["schema_version"] == SCHEMA_VERSION
    again = read_design(path)
    assert again == d
    assert again.position("fc1") == (12.5, -3.25)
    save_design(again, tmp_path / "again.ember.json")
    assert (tmp_path / "again.ember.json").read_text() == text


def test_a_schema_1_file_migrates(tmp_path):
    old = {
        "ember_design": 1,
        "name": "Tiny",
        "nodes": {
            "x": {"type": "Input", "params": {"shape": ["batch", 4]}, "x": 0, "y": 0},
            "fc": {"type": "Linear", "params": {"d_input": 4, "d_output": 2}, "x": 0, "y": 90},
            "x2": {"type": "Input", "params": {"shape": ["batch", 2]}, "x": 200, "y": 90},
            "sum": {"type": "Add", "params": {}, "x": 0, "y": 180},
            "out": {"type": "Output", "params": {}, "x": 0, "y": 270},
        },
        "links": [["x", "fc"], ["fc", "sum"], ["x2", "sum", "in1"], ["sum", "out"]],
    }
    p = tmp_path / "tiny.ember.json"
    p.write_text(json.dumps(old))
    d = read_design(p)
    assert d.name == "Tiny"
    assert d.edges() == [("x", "output", "fc", "input"), ("fc", "output", "sum", "in0"),
                         ("x2", "output", "sum", "in1"), ("sum", "output", "out", "input")]
    assert d.position("fc") == (0.0, 90.0)
    assert analyze(d).output_shapes()["out"].text() == "[batch, 2]"
    # saving writes the current schema
    save_design(d, p)
    assert json.loads(p.read_text())["source"]["schema_version"] == SCHEMA_VERSION
    # schema 1 inside a project source migrates too
    proj = {"format": 1, "source": {"kind": "design", "schema_version": 1, "design": old}}
    p.write_text(json.dumps(proj))
    assert read_design(p) == d


@pytest.mark.parametrize("content, message", [
    ("not json", "not a design file (expected JSON)"),
    (json.dumps({"format": 1, "source": {"kind": "example", "name": "spirals"}}), "a 'example' source"),
    (json.dumps({"format": 1, "source": {"kind": "design", "schema_version": 99, "design": {}}}),
     "design schema 99 is newer than this app reads"),
    (json.dumps({"format": 1, "source": {"kind": "design", "schema_version": 2,
                                         "design": {"nodes": [{"name": "x", "kind": "Dense"}]}}}),
     "unknown node kind 'Dense'"),
    (json.dumps({"ember_design": 1, "nodes": {"a": {"type": "Relu"}}, "links": [["a", "b"]]}),
     "link #0 names an unknown node 'b'"),
])
def test_bad_files_say_what_is_wrong(tmp_path, content, message):
    p = tmp_path / "bad.ember.json"
    p.write_text(content)
    with pytest.raises(DesignFileError, match=re.escape(message)) as e:
        read_design(p)
    assert str(p) in str(e.value)


def test_saving_is_atomic(tmp_path, monkeypatch):
    p = save_design(residual_design(), tmp_path / "r.ember.json")
    before = p.read_text()

    def fail(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        save_design(mnist_design(), p)
    assert p.read_text() == before  # the old file is untouched
    assert [q.name for q in tmp_path.iterdir()] == ["r.ember.json"]  # no temporary left behind


def test_autosaves_of_finished_sessions_are_listed(tmp_path):
    d = residual_design()
    path = write_autosave(tmp_path, "session-a", d, original="/somewhere/r.ember.json")
    found = list_autosaves(tmp_path)
    assert [r.path for r in found] == [path]
    assert found[0].design() == d and found[0].original == "/somewhere/r.ember.json"
    assert "r.ember.json, autosaved" in found[0].describe()
    # a copy whose process still runs belongs to another open editor: not offered
    rec = json.loads(path.read_text())
    rec["pid"] = os.getppid()
    path.write_text(json.dumps(rec))
    assert list_autosaves(tmp_path) == []
    assert len(list_autosaves(tmp_path, include_running=True)) == 1
    discard_autosave(path)
    assert list_autosaves(tmp_path, include_running=True) == []


def test_design_source_is_what_a_project_keeps():
    d = Design()
    d.add_node("Input", "x")
    src = design_source(d)
    assert src == {"kind": "design", "schema_version": SCHEMA_VERSION, "design": d.to_dict()}
