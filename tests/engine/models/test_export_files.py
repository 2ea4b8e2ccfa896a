"""What a Hugging Face export copies and where it writes (issue 43, item 4): only regular files
inside the source folder, never through a link in the export folder, at most
MAX_EXTRA_FILE_BYTES each; a full disk is a PretrainedError naming the file, and the folder is
left as it was (the copies are part of the one atomic save)."""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from engine.models import PretrainedError, from_pretrained, load_peft_adapter, save_peft_adapter, save_pretrained
from engine.models.peft import peft_lora
from engine.models.save import MAX_EXTRA_FILE_BYTES
from engine.module.memory import size_text

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for export\n"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


@pytest.fixture
def source(tmp_path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(HF / "llama-gqa", src)
    return src


def test_a_source_file_that_links_outside_the_folder_is_refused_and_nothing_is_written(source, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_bytes(SECRET)
    (source / "tokenizer.json").unlink()
    os.symlink(secret, source / "tokenizer.json")
    out = tmp_path / "out"
    with pytest.raises(PretrainedError, match="symbolic link to .*id_rsa, outside the model folder") as err:
        save_pretrained(from_pretrained(source), out)
    assert err.value.where == str(source / "tokenizer.json")
    assert not out.exists() and _beside(out) == []
    # a relative link that climbs out is the same
    (source / "tokenizer.json").unlink()
    os.symlink("../id_rsa", source / "tokenizer.json")
    with pytest.raises(PretrainedError, match="outside the model folder"):
        save_pretrained(from_pretrained(source), out)
    assert not out.exists()
    # and copy_extra_files=False saves without it
    save_pretrained(from_pretrained(source), out, copy_extra_files=False)
    assert SECRET not in b"".join(_files(out).values())


def test_a_link_inside_the_source_folder_and_a_hub_cache_snapshot_are_copied_as_files(source, tmp_path):
    (source / "sub").mkdir()
    (source / "tokenizer.json").rename(source / "sub" / "tok.json")
    os.symlink("sub/tok.json", source / "tokenizer.json")
    out = save_pretrained(from_pretrained(source), tmp_path / "out")
    assert not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == (HF / "llama-gqa" / "tokenizer.json").read_bytes()
    # the Hub cache: models--org--name/snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "cache" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for p in (HF / "llama-gqa").iterdir():
        shutil.copyfile(p, blobs / f"hash-{p.name}")
        os.symlink(f"../../blobs/hash-{p.name}", snap / p.name)
    out2 = save_pretrained(from_pretrained(snap), tmp_path / "out2")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out2 / name).read_bytes() == (HF / "llama-gqa" / name).read_bytes() and not (out2 / name).is_symlink()


def test_a_link_in_the_export_folder_is_replaced_never_written_through(source, tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text('{"mine": true}')
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "generation_config.json")
    os.symlink(victim, out / "config.json")
    save_pretrained(from_pretrained(source), out)
    assert victim.read_text() == '{"mine": true}'
    for name in ("generation_config.json", "config.json"):
        assert not (out / name).is_symlink()
    assert (out / "generation_config.json").read_bytes() == (source / "generation_config.json").read_bytes()
    assert from_pretrained(out).config.hidden_size == 48


@pytest.mark.parametrize("kind", ["sparse", "fifo", "folder"])
def test_an_extra_file_that_is_huge_or_not_a_regular_file_is_refused(source, tmp_path, kind):
    path = source / "tokenizer.model"
    if kind == "sparse":  # a hole of MAX_EXTRA_FILE_BYTES + 1: nothing is read or allocated
        with open(path, "wb") as fp:
            fp.truncate(MAX_EXTRA_FILE_BYTES + 1)
        match = f"{MAX_EXTRA_FILE_BYTES + 1} bytes, more than the 128 MiB"
    elif kind == "fifo":  # opening one for reading would wait for a writer forever
        os.mkfifo(path)
        match = "expected a regular file to copy into the save, found not a regular file"
    else:
        path.mkdir()
        match = "expected a regular file to copy into the save, found a folder"
    out = tmp_path / "out"
    save_pretrained(from_pretrained(HF / "llama-sharded"), out)
    before = _files(out)
    with pytest.raises(PretrainedError, match=match) as err:
        save_pretrained(from_pretrained(source), out)
    assert err.value.where == str(path)
    assert _files(out) == before and _beside(out) == []


class _Disk:
    """os.fdopen whose files for writing share `free` bytes, then fail as a full disk does."""

    def __init__(self, monkeypatch, free: int):
        self.free, self.real = free, os.fdopen
        monkeypatch.setattr(os, "fdopen", self.fdopen)

    def fdopen(self, fd, mode="r", *args, **kwargs):
        fp = self.real(fd, mode, *args, **kwargs)
        return fp if "w" not in mode else _Full(fp, self)


class _Full:
    def __init__(self, fp, disk):
        self.fp, self.disk = fp, disk

    def write(self, data):
        n = memoryview(data).nbytes
        if n > self.disk.free:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.disk.free -= n
        return self.fp.write(data)

    def __getattr__(self, name):
        return getattr(self.fp, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.fp.__exit__(*exc)


def test_a_full_disk_is_a_pretrained_error_and_leaves_the_folder_as_it_was(source, tmp_path, monkeypatch):
    out = tmp_path / "out"
    save_pretrained(from_pretrained(HF / "llama-sharded"), out, max_shard_size=40_000)
    (out / "notes.txt").write_text("mine")
    before = _files(out)
    model = from_pretrained(source)
    total = sum(len(b) for b in _files(save_pretrained(model, tmp_path / "probe", max_shard_size=40_000)).values())
    for free in (total // 3, total * 2 // 3, total - 100, 0):
        with monkeypatch.context() as m:
            _Disk(m, free)
            with pytest.raises(PretrainedError) as err:
                save_pretrained(model, out, max_shard_size=40_000)
        assert _files(out) == before, free
        assert _beside(out) == []
        assert "the disk is full (No space left on device)" in str(err.value)
        assert Path(err.value.where).parent == out and Path(err.value.where).name in _files(tmp_path / "probe")


def test_a_full_disk_during_an_adapter_export_keeps_the_old_adapter(tmp_path, monkeypatch):
    base = from_pretrained(HF / "llama-gqa")
    out = save_peft_adapter(base.apply_lora(peft_lora(base, r=4, init_std=0.02)), tmp_path / "adapter")
    before = _files(out)
    tuned = base.apply_lora(peft_lora(base, r=8, init_std=0.02))
    weights = len(_files(save_peft_adapter(tuned, tmp_path / "probe"))["adapter_model.safetensors"])
    for free in (weights + 10, 100, 0):  # the first: room for the new weights, not for the new config
        with monkeypatch.context() as m:
            _Disk(m, free)
            with pytest.raises(PretrainedError) as err:
                save_peft_adapter(tuned, out)
        assert _files(out) == before and _beside(out) == []
        assert "the disk is full" in str(err.value)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    load_peft_adapter(base, out)


def test_a_save_the_disk_cannot_hold_beside_the_old_one_is_refused_before_writing(source, tmp_path, monkeypatch):
    out = tmp_path / "out"
    save_pretrained(from_pretrained(HF / "llama-sharded"), out)
    before = _files(out)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100_000))
    model = from_pretrained(source)
    tensors = sum(p.numel() * 4 for _, p in model.named_params())  # float32, as the source stores them
    extras = sum((source / n).stat().st_size for n in ("tokenizer.json", "tokenizer_config.json",
                                                       "generation_config.json"))
    with pytest.raises(PretrainedError, match=rf"the save needs {size_text(tensors + extras)} of free disk space "
                                              rf".* the disk has 100\.0 kB") as err:
        save_pretrained(model, out)
    assert err.value.where == str(out) and _files(out) == before and _beside(out) == []
