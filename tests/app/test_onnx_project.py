"""A project saved after File ▸ Open ONNX… reopens the file's model with the file's weights (issue 21,
a data-loss bug: the project replayed the design only, so a reopened project had freshly initialized
weights). Driven through the menus with the file dialogs monkeypatched; the weights are checked bit
for bit against an independent import of the file, the outputs against the torch oracle's."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QFileDialog

from app.core.schema import GroupEdit, GroupSpec, Project, SchemaError
from app.settings import Settings
from engine import Tensor
from engine.interop import import_onnx
from tests.app.window_helpers import open_onnx, wait_idle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"


def _save_project(window, monkeypatch, path):
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), ""))
    window.actions.save_project_as.trigger()


def _open_project(window, qtbot, monkeypatch, path):
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.actions.open_project.trigger()
    wait_idle(qtbot, window)


def _fresh_window(qtbot, tmp_path, name):
    from app.main_window import MainWindow

    w = MainWindow(settings=Settings.at(tmp_path / f"{name}.ini"))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    return w


def _arrays(record) -> dict:
    return {name: (str(e.dtype), tuple(e.shape), np.ascontiguousarray(np.asarray(e.array)).tobytes())
            for name, e in record.items()}


def _assert_the_files_model(module, onnx_path):
    """`module` holds exactly the weights an independent import of the file reads, bit for bit,
    and computes what torch computed for the fixture."""
    imported = import_onnx(onnx_path)
    got, want = _arrays(module.into_record()), _arrays(imported.record)
    assert set(got) == set(want) and want
    for name in want:
        assert got[name] == want[name], name
    oracle = np.load(FIXTURES / "cnn_bn.npz")
    out = module.valid().forward(Tensor(oracle["x"])).numpy()
    assert np.allclose(out, oracle["out:logits"], atol=1e-4)
    return out


@pytest.fixture
def saved(window, qtbot, monkeypatch, tmp_path):
    """cnn_bn.onnx copied into a project folder, opened with File ▸ Open ONNX…, one parameter group
    frozen, saved as a project beside it; (project path, the outputs of the saved model)."""
    folder = tmp_path / "proj"
    folder.mkdir()
    onnx_path = folder / "cnn_bn.onnx"
    shutil.copyfile(FIXTURES / "cnn_bn.onnx", onnx_path)
    open_onnx(qtbot, window, monkeypatch, onnx_path, close_report=True)
    freeze = GroupEdit("freeze", GroupSpec("path", path="conv1_conv"))
    assert window.apply_edit(freeze)
    out = _assert_the_files_model(window.document.module, onnx_path)
    project = folder / "model.ember.json"
    _save_project(window, monkeypatch, project)
    assert project.is_file() and not window.document.is_dirty()
    return project, out


def _frozen(module) -> dict:
    return {path: p.is_require_grad() for path, p in module.named_params()}


def test_a_project_saved_after_an_onnx_import_reopens_the_files_weights(window, saved, qtbot, monkeypatch, tmp_path):
    project, out = saved
    fresh = _fresh_window(qtbot, tmp_path, "fresh")
    _open_project(fresh, qtbot, monkeypatch, project)
    doc = fresh.document
    got = _assert_the_files_model(doc.module, project.parent / "cnn_bn.onnx")  # before the fix: fresh weights
    assert np.array_equal(got, out)
    assert doc.source.kind == "onnx" and doc.project_path == project and not doc.is_dirty()
    # the edit made after the import is replayed: the same parameters frozen, the same edits kept
    assert _frozen(doc.module) == _frozen(window.document.module)
    assert not all(_frozen(doc.module).values()) and any(_frozen(doc.module).values())
    assert doc.edits == [GroupEdit("freeze", GroupSpec("path", path="conv1_conv"))]
    # the designer shows the file's design, as Open ONNX does
    assert fresh.designer.design.to_dict() == window.designer.design.to_dict()
    # the project names the file (relative to itself) and the edit made since
    data = json.loads(project.read_text())
    assert data["source"]["kind"] == "onnx" and data["source"]["path"] == "cnn_bn.onnx"
    assert len(data["source"]["sha256"]) == 64
    assert data["edits"] == [GroupEdit("freeze", GroupSpec("path", path="conv1_conv")).to_json()]


def test_the_project_folder_moved_with_its_onnx_file_still_opens_whole(saved, qtbot, monkeypatch, tmp_path):
    project, out = saved
    moved = tmp_path / "elsewhere" / "moved"
    shutil.move(str(project.parent), str(moved))
    fresh = _fresh_window(qtbot, tmp_path, "moved")
    _open_project(fresh, qtbot, monkeypatch, moved / project.name)
    doc = fresh.document
    assert doc.module is not None and Path(doc.source.path) == moved / "cnn_bn.onnx"
    assert np.array_equal(_assert_the_files_model(doc.module, moved / "cnn_bn.onnx"), out)


def test_a_project_whose_onnx_file_is_missing_says_so_and_changes_nothing(saved, qtbot, monkeypatch, tmp_path):
    project, _out = saved
    (project.parent / "cnn_bn.onnx").unlink()
    fresh = _fresh_window(qtbot, tmp_path, "missing")
    fresh.open_example("burn-mnist")
    before, source = fresh.document.module, fresh.document.source
    _open_project(fresh, qtbot, monkeypatch, project)
    assert fresh.document.module is before and fresh.document.source == source
    text = fresh.last_message.text()
    assert str(project) in text and "cnn_bn.onnx: no such file" in text and "Nothing was changed" in text


def test_a_project_whose_onnx_file_changed_is_refused(saved, qtbot, monkeypatch, tmp_path):
    project, _out = saved
    shutil.copyfile(FIXTURES / "cnn_folded.onnx", project.parent / "cnn_bn.onnx")  # other weights, same name
    fresh = _fresh_window(qtbot, tmp_path, "changed")
    fresh.open_example("burn-mnist")
    before = fresh.document.module
    _open_project(fresh, qtbot, monkeypatch, project)
    assert fresh.document.module is before
    text = fresh.last_message.text()
    assert "cnn_bn.onnx" in text and "changed since the project was saved" in text


def test_a_model_built_from_the_edited_design_is_not_saved_without_its_weights(window, qtbot, monkeypatch, tmp_path):
    open_onnx(qtbot, window, monkeypatch, FIXTURES / "cnn_bn.onnx", close_report=True)
    panel = window.designer
    panel.canvas.select(["relu"])
    assert panel.delete_selection()
    panel.canvas.select(["bn1_batchnormalization"])
    gelu = panel.add_node("Gelu")
    assert panel.connect_ports(gelu, panel.design.output_ports(gelu)[0], "pool_maxpool",
                               panel.design.input_ports("pool_maxpool")[0])
    assert panel.build(ask=False) is window.document.module  # the file's weights, where they fit
    project = tmp_path / "edited.ember.json"
    _save_project(window, monkeypatch, project)
    assert not project.exists()
    text = window.last_message.text()
    assert "edited.ember.json was not written" in text and "cnn_bn.onnx" in text and "Export" in text


def test_the_onnx_source_is_validated():
    good = {"format": 1, "source": {"kind": "onnx", "path": "m.onnx", "sha256": "ab" * 32}}
    assert Project.from_json(good).source.to_json() == good["source"]
    for source, where in [({"kind": "onnx", "sha256": "ab" * 32}, "source.path"),
                          ({"kind": "onnx", "path": "x" * 5000, "sha256": "ab" * 32}, "source.path"),
                          ({"kind": "onnx", "path": "m.onnx"}, "source.sha256"),
                          ({"kind": "onnx", "path": "m.onnx", "sha256": "not a digest"}, "source.sha256")]:
        with pytest.raises(SchemaError) as e:
            Project.from_json({"format": 1, "source": source})
        assert e.value.where == where
