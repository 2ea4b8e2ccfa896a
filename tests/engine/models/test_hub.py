"""`from_pretrained("org/name")` through huggingface_hub, against a local HTTP server that serves
fixture folders with the Hub's URL layout (nothing leaves the machine).

What `snapshot_download` (huggingface_hub 2.x) asks of a Hub, read from its source:

- `GET /api/models/{repo}/revision/{rev}`: the repo's JSON (`id`, `sha` the commit, `siblings`);
- `GET /api/models/{repo}/tree/{commit}?recursive=True`: the file list (`type`, `path`, `size`,
  `oid`, and `lfs` {`oid` sha256, `size`, `pointerSize`} for large files), cached on disk and used
  later to tell whether an offline snapshot is complete;
- per file `HEAD /{repo}/resolve/{commit}/{file}` with `X-Repo-Commit`, `ETag` (or `X-Linked-Etag`)
  and `Content-Length` (or `X-Linked-Size`), then `GET` of the same address for the bytes;
- an unknown repo is a 404 with `X-Error-Code: RepoNotFound`.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest

hf_constants = pytest.importorskip("huggingface_hub.constants")

from engine import Tensor  # noqa: E402
from engine.models import PretrainedError, from_pretrained  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
LFS_SUFFIXES = (".safetensors", ".bin")


class _Repo:
    def __init__(self, folder: Path):
        self.folder = folder
        self.files = sorted(p.name for p in folder.iterdir() if p.is_file())
        digest = hashlib.sha1()
        for name in self.files:
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
        self.sha = digest.hexdigest()  # 40 hex digits, as a git commit id

    def entry(self, name: str) -> dict:
        data = (self.folder / name).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        out = {"type": "file", "path": name, "size": len(data), "oid": blob}
        if name.endswith(LFS_SUFFIXES):
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out


class LocalHub:
    """A threaded HTTP server speaking the part of the Hub's protocol that snapshot_download uses."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {rid: _Repo(folder) for rid, folder in repos.items()}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._serve(self, body=True)

            def do_HEAD(self):
                hub._serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.running = True

    def stop(self):
        if self.running:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)
            self.running = False

    def downloaded(self) -> list[str]:
        return [path.rsplit("/", 1)[-1] for method, path in self.requests if method == "GET" and "/resolve/" in path]

    # ------------------------------------------------------------------------------ answers
    def _send(self, h, status: int, payload: bytes, headers: dict, body: bool):
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _json(self, h, obj, body, status=200, headers=None):
        self._send(h, status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})}, body)

    def _not_found(self, h, body, code="RepoNotFound", commit=None):
        headers = {"X-Error-Code": code, "X-Error-Message": "Repository not found" if code == "RepoNotFound"
                   else "Entry not found"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._json(h, {"error": headers["X-Error-Message"]}, body, status=404, headers=headers)

    def _serve(self, h, body: bool):
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            rid = "/".join(parts[2:4])
            repo = self.repos.get(rid)
            if repo is None:
                return self._not_found(h, body)
            rest = parts[4:]
            if rest[:1] in ([], ["revision"]):
                return self._json(h, {"id": rid, "modelId": rid, "sha": repo.sha, "private": False,
                                      "siblings": [{"rfilename": f} for f in repo.files]}, body)
            if rest[:1] == ["tree"]:
                return self._json(h, [repo.entry(f) for f in repo.files], body)
            return self._not_found(h, body, "EntryNotFound")
        if len(parts) >= 5 and parts[2] == "resolve":
            rid, name = "/".join(parts[:2]), "/".join(parts[4:])
            repo = self.repos.get(rid)
            if repo is None:
                return self._not_found(h, body)
            if name not in repo.files:
                return self._not_found(h, body, "EntryNotFound", commit=repo.sha)
            data = (repo.folder / name).read_bytes()
            entry = repo.entry(name)
            headers = {"X-Repo-Commit": repo.sha, "Content-Type": "application/octet-stream",
                       "ETag": f'"{entry["oid"]}"'}
            if "lfs" in entry:  # what the Hub sends for LFS files: the sha256 and size of the content
                headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
                headers["X-Linked-Size"] = str(len(data))
            return self._send(h, 200, data, headers, body)
        return self._not_found(h, body, "EntryNotFound")


@pytest.fixture
def mixed_folder(tmp_path):
    """A repo with safetensors weights and a pytorch_model.bin beside them (as many on the Hub have)."""
    folder = tmp_path / "mixed"
    shutil.copytree(FIXTURES / "llama-gqa", folder)
    shutil.copyfile(FIXTURES / "llama-bin" / "pytorch_model.bin", folder / "pytorch_model.bin")
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch, mixed_folder):
    server = LocalHub({
        "ember-test/llama-gqa": FIXTURES / "llama-gqa",
        "ember-test/llama-sharded": FIXTURES / "llama-sharded",
        "ember-test/llama-bin": FIXTURES / "llama-bin",
        "ember-test/mixed": mixed_folder,
    })
    cache = tmp_path / "hf-cache"
    # the environment as a user sets it, and the constants huggingface_hub read from it at import
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", server.url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True, raising=False)  # plain HTTP, no Xet
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_PROGRESS_BARS", True, raising=False)
    server.cache = cache
    yield server
    server.stop()


def _logits(model, name="llama-gqa"):
    exp = np.load(FIXTURES / name / "expected.npz")
    out = model.valid().forward(Tensor.from_data(exp["input_ids"]), attention_mask=Tensor.from_data(exp["attention_mask"]))
    return out.numpy(), exp["logits"]


def _same_files(folder: Path, source: Path, names):
    for name in names:
        assert (folder / name).read_bytes() == (source / name).read_bytes(), name


def test_hub_id_opens_the_served_folder_with_the_same_logits(hub):
    model = from_pretrained("ember-test/llama-gqa")
    got, expected = _logits(model)
    direct, _ = _logits(from_pretrained(FIXTURES / "llama-gqa"))
    np.testing.assert_allclose(got, direct, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    # the files came over HTTP into huggingface_hub's cache layout, byte for byte
    repo = hub.repos["ember-test/llama-gqa"]
    snapshot = hub.cache / "models--ember-test--llama-gqa" / "snapshots" / repo.sha
    _same_files(snapshot, FIXTURES / "llama-gqa", ["config.json", "model.safetensors", "tokenizer.json"])
    assert (hub.cache / "models--ember-test--llama-gqa" / "refs" / "main").read_text() == repo.sha
    assert sorted(hub.downloaded()) == sorted(f for f in repo.files if f not in (
        "expected.npz", "tokenizer_expected.json", "generate_expected.json", "padded_logits.npz",
        "greedy_batch.npz"))  # the tests' own answers


def test_second_open_works_offline_from_the_cache(hub):
    first, _ = _logits(from_pretrained("ember-test/llama-sharded"), "llama-sharded")
    hub.stop()  # nothing answers any more
    n = len(hub.requests)
    model = from_pretrained("ember-test/llama-sharded", local_files_only=True)
    again, expected = _logits(model, "llama-sharded")
    np.testing.assert_allclose(again, first, rtol=0, atol=1e-6)
    np.testing.assert_allclose(again, expected, rtol=0, atol=1e-4)
    assert len(hub.requests) == n
    # the Hub unreachable without local_files_only: huggingface_hub falls back to its cache as well
    model = from_pretrained("ember-test/llama-sharded")
    np.testing.assert_allclose(_logits(model, "llama-sharded")[0], first, rtol=0, atol=1e-6)


def test_offline_without_a_cached_copy_names_the_id(hub):
    with pytest.raises(PretrainedError, match="ember-test/llama-gqa") as info:
        from_pretrained("ember-test/llama-gqa", local_files_only=True)
    assert info.value.where == "ember-test/llama-gqa"
    assert hub.requests == []


def test_unknown_repo_is_a_pretrained_error_naming_the_id(hub):
    with pytest.raises(PretrainedError, match=r"ember-test/no-such-model") as info:
        from_pretrained("ember-test/no-such-model")
    assert "RepositoryNotFound" in str(info.value) or "not found" in str(info.value).lower()
    assert "no local folder of that name" in str(info.value)  # a mistyped relative path reads as an id
    assert ("GET", "/api/models/ember-test/no-such-model/revision/main") in hub.requests


def test_repo_without_safetensors_gets_pytorch_model_bin(hub):
    model = from_pretrained("ember-test/llama-bin")
    got, expected = _logits(model, "llama-bin")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    assert "pytorch_model.bin" in hub.downloaded()
    # and offline too, from the cache
    hub.stop()
    again, _ = _logits(from_pretrained("ember-test/llama-bin", local_files_only=True), "llama-bin")
    np.testing.assert_allclose(again, got, rtol=0, atol=1e-6)


def test_repo_with_both_formats_downloads_only_the_safetensors(hub):
    model = from_pretrained("ember-test/mixed")
    got, expected = _logits(model)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    fetched = hub.downloaded()
    assert "model.safetensors" in fetched
    assert "pytorch_model.bin" not in fetched


def test_a_path_that_is_neither_a_folder_nor_an_id_is_refused_without_network(hub, tmp_path):
    with pytest.raises(PretrainedError, match="no such folder"):
        from_pretrained(str(tmp_path / "missing" / "folder"))
    with pytest.raises(PretrainedError, match="no such folder"):
        from_pretrained("../escape/me")
    assert hub.requests == []
