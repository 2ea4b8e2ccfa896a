"""Pretrained architectures read from and written to Hugging Face checkpoint folders.

`from_pretrained(folder)` picks the family from `config.json`, builds the model from `engine.nn`
layers with every parameter lazy, and ties each parameter to its stored tensor: nothing is read
until a value is used. `save_pretrained(model, folder)` writes the folder back with Hugging Face's
names and layout. The per-family name tables are data (`engine.models.mapping`).

The names below are imported on first use, so that `engine.models.mapping` or one family's
module can be imported alone.
"""
import importlib

_NAMES = {
    "PretrainedError": "hf_folder", "open_checkpoint": "hf_folder",
    "FAMILIES": "pretrained", "Family": "pretrained", "PretrainedInfo": "pretrained",
    "from_pretrained": "pretrained", "pretrained_info": "pretrained", "pretrained_names": "pretrained",
    "save_pretrained": "save", "supported_architectures": "pretrained",
    "load_peft_adapter": "peft", "save_peft_adapter": "peft",
    "generate": "generate",
    "save_gguf": "gguf_export", "save_gguf_lora": "gguf_lora", "write_modelfile": "ollama",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'engine.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
