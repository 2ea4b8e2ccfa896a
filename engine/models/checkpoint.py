"""The old name of `hf_folder.py` (a Hugging Face folder is not a training checkpoint), kept only
for engine/models/training_script.py, which another part of issue 44 is moving: import
`PretrainedError` from `engine.models.hf_folder`, and delete this file once nothing imports it."""
from .hf_folder import PretrainedError  # noqa: F401
