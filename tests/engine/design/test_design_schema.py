"""Design files are checked against the design schema before any of them is used (issue 18,
item 14): each fault is a `DesignFileError` naming the file, the key and what was expected."""
import json

import pytest

from engine.design import DesignFileError, mnist_design, read_design, save_design
from engine.design.design_schema import MAX_JSON_DEPTH, check_design

NODE = {"name": "x", "kind": "Input", "config": {"shape": ["batch", 4]}, "position": [0, 0]}


def _project(design) -> str:
    return json.dumps({"format": 1, "application": "ember",
                       "source": {"kind": "design", "schema_version": 2, "design": design}})


@pytest.mark.parametrize("text, where, expected", [
    (_project({"nodes": [NODE, {"name": "e", "kind": "../../evil.py"}]}), "source.design.nodes[1].kind",
     "unknown node kind '../../evil.py'"),
    (_project({"nodes": [dict(NODE, script="evil.py")]}), "source.design.nodes[0].script", "the unknown key 'script'"),
    (_project({"nodes": [NODE], "script": "evil.py"}), "source.design.script", "the unknown key 'script'"),
    (_project({"nodes": [{"name": "f", "kind": "Linear", "config": {"module": "evil.py"}}]}),
     "source.design.nodes[0].config.module", "a field of Linear"),
    (_project({"nodes": [{"name": "s", "kind": "Add", "config": {"inputs": 10 ** 9}}]}),
     "source.design.nodes[0].config.inputs", "a number of inputs from 2 to 256"),
    (_project({"nodes": [dict(NODE, position=[0, 1e300])]}), "source.design.nodes[0].position[1]", "finite"),
    (_project({"nodes": [dict(NODE, kind={"a": 1})]}), "source.design.nodes[0].kind", "a node kind (text)"),
    (_project({"nodes": [dict(NODE, config=[["shape", 1]])]}), "source.design.nodes[0].config", "configuration"),
    (_project({"nodes": "x" * 10}), "source.design.nodes", "a list of nodes"),
    (_project({"nodes": [NODE], "edges": [{"from": "x", "to": "y"}]}), "source.design.edges[0].from_port",
     "a port name"),
    (_project({"nodes": [dict(NODE, name="n" * 300)]}), "source.design.nodes[0].name", "at most 256 characters"),
    (json.dumps({"format": 1, "source": {"kind": "design", "schema_version": 2, "design": {}, "run": "evil.py"}}),
     "source.run", "the unknown key 'run'"),
    (json.dumps({"ember_design": 1, "nodes": {"a": {"type": "evil.py"}}}), "nodes['a'].type", "unknown node kind"),
    ('{"ember_design": 1, "nodes": {}, "nodes": {"a": {"type": "Relu"}}}', "", "the key 'nodes' given twice"),
    (_project({"nodes": [NODE]}).replace("[0, 0]", "[0, NaN]"), "", "NaN, which is not a JSON number"),
    ('{"ember_design": 1, "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}", "",
     f"nested at most {MAX_JSON_DEPTH} levels"),
    ('{"ember_design": 1, "nodes": {}, "x": ' + "9" * 4400 + "}", "", "numbers of ordinary size"),
])
def test_a_malformed_design_says_where_and_what_was_expected(tmp_path, text, where, expected):
    path = tmp_path / "bad.ember.json"
    path.write_text(text)
    with pytest.raises(DesignFileError) as e:
        read_design(path)
    message = str(e.value)
    assert str(path) in message and where in message and expected in message, message


def test_a_design_written_by_the_app_fits_the_schema(tmp_path):
    path = save_design(mnist_design(), tmp_path / "m.ember.json")
    data = json.loads(path.read_text())
    assert check_design(data["source"]["design"]) is data["source"]["design"]
    assert read_design(path) == mnist_design()


def test_a_design_file_that_is_not_a_regular_file_is_refused_without_reading(tmp_path):
    import os

    fifo = tmp_path / "pipe.ember.json"
    os.mkfifo(fifo)  # opening a FIFO for reading would block until a writer came
    with pytest.raises(DesignFileError, match="expected a regular file"):
        read_design(fifo)


def test_unreadable_autosaves_are_skipped_not_raised(tmp_path):
    from engine.design import list_autosaves, write_autosave

    good = write_autosave(tmp_path, "s1", mnist_design())
    (tmp_path / "s2.ember-design.autosave").write_text("[" * 100_000)
    (tmp_path / "s3.ember-design.autosave").write_text('{"ember": "design-autosave", "pid": ' + "9" * 4400 + "}")
    (tmp_path / "s4.ember-design.autosave").write_text('["design-autosave"]')
    found = list_autosaves(tmp_path, include_running=True)
    assert [r.path for r in found] == [good] and found[0].design() == mnist_design()
