"""Other spellings of one family's files (WeightMap aliases): the original GPT-2 files without
the `transformer.` wrapper, old BERT files with LayerNorm `gamma` / `beta`, a bert.-prefixed file
opened as BertModel. Each loads with the outputs of the canonical file; saving writes the
canonical names."""
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine import Tensor
from engine.models import PretrainedError, from_pretrained, pretrained_info, save_pretrained

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"


def _renamed(src: Path, dst: Path, rename) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    save_file({rename(k): v for k, v in tensors.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _gpt2_logits(folder):
    exp = np.load(HF / "gpt2" / "expected.npz")
    model = from_pretrained(folder).valid()
    return model.forward(Tensor.from_data(exp["input_ids"])).numpy(), exp["logits_nomask"]


def test_gpt2_files_without_the_transformer_wrapper(tmp_path):
    folder = _renamed(HF / "gpt2", tmp_path / "gpt2-orig", lambda k: re.sub(r"\Atransformer\.", "", k))
    assert not any(k.startswith("transformer.") for k in load_file(str(folder / "model.safetensors")))
    got, expected = _gpt2_logits(folder)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    out = save_pretrained(from_pretrained(folder), tmp_path / "saved")
    names = set(load_file(str(out / "model.safetensors")))
    assert names == set(load_file(str(HF / "gpt2" / "model.safetensors")))  # canonical names


def test_bert_gamma_beta_and_prefixed_files(tmp_path):
    exp = np.load(HF / "bert" / "expected.npz")

    def hidden(folder):
        m = from_pretrained(folder).valid()
        return m.forward(Tensor.from_data(exp["input_ids"]), attention_mask=Tensor.from_data(exp["attention_mask"]),
                         token_type_ids=Tensor.from_data(exp["token_type_ids"])).numpy()

    old = _renamed(HF / "bert", tmp_path / "old", lambda k: re.sub(r"LayerNorm\.weight\Z", "LayerNorm.gamma",
                                                                     re.sub(r"LayerNorm\.bias\Z", "LayerNorm.beta", k)))
    assert any(k.endswith("LayerNorm.gamma") for k in load_file(str(old / "model.safetensors")))
    np.testing.assert_allclose(hidden(old), exp["last_hidden_state"], atol=1e-4)

    def prefixed(k):
        return "bert." + k
    pre = _renamed(HF / "bert", tmp_path / "pre", prefixed)
    np.testing.assert_allclose(hidden(pre), exp["last_hidden_state"], atol=1e-4)


def test_two_spellings_of_one_tensor_are_refused(tmp_path):
    folder = tmp_path / "both"
    shutil.copytree(HF / "gpt2", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["wte.weight"] = tensors["transformer.wte.weight"]  # the same tensor under both names
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PretrainedError, match="maps both .*wte.weight"):
        from_pretrained(folder)


def test_an_unsupported_architecture_is_named_before_missing_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["MambaForCausalLM"], "model_type": "mamba"}')
    with pytest.raises(PretrainedError, match="unsupported architecture: found MambaForCausalLM; mamba is a state-space model, and "
                                              "no supported family is close to it; supported: "
                                              ".*LlamaForCausalLM.*GPT2LMHeadModel"):
        from_pretrained(tmp_path)


def test_saving_an_unread_model_in_another_dtype_reads_the_files_not_the_model(tmp_path):
    model = from_pretrained(HF / "llama-gqa")
    out = save_pretrained(model, tmp_path / "bf16", dtype="bfloat16")
    assert not any(p.is_initialized() for _, p in model.named_params())  # nothing kept in the model
    back = from_pretrained(out)
    assert set(pretrained_info(back).stored_dtypes.values()) == {"BF16"}
    exp = np.load(HF / "llama-gqa" / "expected.npz")
    got = back.valid().forward(Tensor.from_data(exp["input_ids"])).numpy()
    np.testing.assert_allclose(got, exp["logits_nomask"], atol=0.1)  # bf16 rounding of every weight
