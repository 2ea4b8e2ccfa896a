"""Model ids on the Hugging Face Hub, through `huggingface_hub` (its cache, token and endpoint).

`from_pretrained("org/name")` calls `download`: the files a model folder needs (config,
safetensors weights and index, tokenizer and generation files) are fetched into the
library's cache, or found there (`local_files_only=True` never touches the network); a repo
with only `pytorch_model*.bin` weights gets those instead. `HF_ENDPOINT` and `HF_TOKEN` work
as with transformers. Failures are `PretrainedError`s naming the id.

`progress(fraction)` hears how much of the bytes to fetch have arrived (through the library's
`tqdm_class` hook: its byte counters, summed over the files), and `check()` runs at each of
those updates: what it raises (a worker's cancellation) stops the download and propagates as it
is, not as a PretrainedError.
"""
from __future__ import annotations

import re
from pathlib import Path

from .hf_folder import PretrainedError

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_hub_id(text: str) -> bool:
    """Whether `text` has the form of a Hub model id, 'org/name' (no '..')."""
    return bool(HUB_ID.fullmatch(text)) and ".." not in text

CONFIG_AND_EXTRAS = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json", "preprocessor_config.json",
]
SAFETENSORS = ["model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"]
PICKLES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"]


def _has(folder: Path, patterns) -> bool:
    return any(any(folder.glob(p)) for p in patterns)


def _progress_class(progress, check, stopped: list):
    """A tqdm class for `snapshot_download(tqdm_class=...)` that shows nothing and reports the
    bytes bars' fraction to `progress` and runs `check` (its exception kept in `stopped`)."""
    from tqdm.auto import tqdm  # noqa: PLC0415 - huggingface_hub's own dependency

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # no bar on a terminal: the window shows the progress
            super().__init__(*args, **kwargs)
            self.is_bytes = kwargs.get("unit") == "B"

        def update(self, n=1):
            try:
                if check is not None:
                    check()
            except BaseException as exc:
                stopped.append(exc)
                raise
            self.n += n or 0
            if self.is_bytes and progress is not None and self.total:
                progress(min(1.0, self.n / self.total))
            return True

    return Progress


def download(snapshot_download, repo_id: str, *, revision=None, token=None, cache_dir=None,
             local_files_only=False, progress=None, check=None) -> Path:
    stopped: list[BaseException] = []
    extra = {"tqdm_class": _progress_class(progress, check, stopped)} if progress or check else {}

    def fetch(patterns):
        if check is not None:
            check()
        try:
            return Path(snapshot_download(repo_id, revision=revision, token=token, cache_dir=cache_dir,
                                          local_files_only=local_files_only, allow_patterns=patterns, **extra))
        except Exception as exc:  # the library's own errors: not found, gated, offline, HTTP
            if stopped:  # cancelled: the caller's own exception, not a failure of the Hub
                raise stopped[0] from None
            kind = type(exc).__name__
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else kind
            raise PretrainedError(f"could not get {repo_id!r} from the Hugging Face Hub ({kind}): {text} "
                                  f"(there is no local folder of that name, so it was taken as a Hub model id)",
                                  where=repo_id) from None

    folder = fetch(CONFIG_AND_EXTRAS + SAFETENSORS)
    if not _has(folder, SAFETENSORS):
        folder = fetch(CONFIG_AND_EXTRAS + PICKLES)
    if not (folder / "config.json").is_file():
        raise PretrainedError(f"the Hub repo {repo_id!r} has no config.json: not a transformers model folder",
                              where=repo_id)
    return folder
