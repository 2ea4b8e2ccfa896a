"""Model ids on the Hugging Face Hub, through `huggingface_hub` (its cache, token and endpoint).

`from_pretrained("org/name")` calls `download`: the files a model folder needs (config,
safetensors weights and index, tokenizer and generation files) are fetched into the
library's cache, or found there (`local_files_only=True` never touches the network); a repo
with only `pytorch_model*.bin` weights gets those instead. `HF_ENDPOINT` and `HF_TOKEN` work
as with transformers. Failures are `PretrainedError`s naming the id.
"""
from __future__ import annotations

from pathlib import Path

from .hf_folder import PretrainedError

CONFIG_AND_EXTRAS = [
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json", "preprocessor_config.json",
]
SAFETENSORS = ["model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"]
PICKLES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"]


def _has(folder: Path, patterns) -> bool:
    return any(any(folder.glob(p)) for p in patterns)


def download(snapshot_download, repo_id: str, *, revision=None, token=None, cache_dir=None,
             local_files_only=False) -> Path:
    def fetch(patterns):
        try:
            return Path(snapshot_download(repo_id, revision=revision, token=token, cache_dir=cache_dir,
                                          local_files_only=local_files_only, allow_patterns=patterns))
        except Exception as exc:  # the library's own errors: not found, gated, offline, HTTP
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
