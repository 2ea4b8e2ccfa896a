"""GGUF files: opened lazily, weights kept quantized, values and logits against the `gguf`
package's own reading and dequantization, refusals of what Ember does not read (issue 46).

The fixtures (tests/fixtures/gguf/, made by make_gguf_fixtures.py there) are written with
`gguf.GGUFWriter`; the references are computed here with `gguf.GGUFReader` and
`gguf.quants.dequantize`, independently of Ember's reader.
"""
from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from engine.models import from_pretrained, pretrained_info  # noqa: E402
from engine.models.gguf_weight import GGUFWeight, dequantize_blocks  # noqa: E402
from engine.models.hf_folder import PretrainedError  # noqa: E402
from engine.module.tree import params as tree_params  # noqa: E402
from engine.store.errors import RecordError  # noqa: E402
from engine.store.gguf_file import SUPPORTED_TYPES, GGUFError, open_gguf  # noqa: E402
from engine.tensor import Tensor  # noqa: E402
from engine.tensor.cpu import jit  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gguf"
MIXED = FIXTURES / "tiny-llama-mixed.gguf"
QWEN = FIXTURES / "tiny-qwen2-q8.gguf"


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_gguf_fixtures", FIXTURES / "make_gguf_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


maker = _load_maker()
IDS = np.array([[1, 5, 7, 9, 42, 3, 250, 17]])


def _logits(model) -> np.ndarray:
    return model.forward(Tensor.from_data(IDS, dtype="int64")).numpy()


def _save_hf_folder(folder: Path, config: dict, tensors: dict) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
              str(folder / "model.safetensors"))
    return folder


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's q/k row permutation (interleaved pairs -> Hugging Face's halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _reference_tensors(path: Path, config: dict, arch: str) -> dict:
    """{Hugging Face name: float32} of a GGUF file, read and dequantized by the gguf package."""
    hf_names = maker.tiny_hf_tensors(config, np.random.default_rng(0), tied=config["tie_word_embeddings"],
                                     bias=config["attention_bias"])
    by_gguf = {maker.hf_to_gguf_name(n): n for n in hf_names}
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        values = values.reshape(tuple(reversed([int(d) for d in t.shape])))
        name = by_gguf[t.name]
        if arch == "llama" and name.endswith("q_proj.weight"):
            values = _unpermute(values, config["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            values = _unpermute(values, config["num_key_value_heads"])
        out[name] = values
    return out


# ---------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_float32_gguf_gives_the_logits_of_its_hugging_face_folder(tmp_path, model_type):
    config = maker.tiny_config(model_type, 2, 300)
    tensors = maker.tiny_hf_tensors(config, np.random.default_rng(7), tied=config["tie_word_embeddings"],
                                    bias=config["attention_bias"])
    folder = _save_hf_folder(tmp_path / "hf", config, tensors)
    path = tmp_path / "model.gguf"
    maker.write_gguf(path, model_type, config, tensors)
    ours = _logits(from_pretrained(path))
    theirs = _logits(from_pretrained(folder))
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("path, model_type, layers", [(MIXED, "llama", 2), (QWEN, "qwen2", 1)])
def test_quantized_gguf_gives_the_logits_of_gguf_dequantized_weights(tmp_path, path, model_type, layers):
    config = maker.tiny_config(model_type, layers, 300)
    folder = _save_hf_folder(tmp_path / "hf", config, _reference_tensors(path, config, model_type))
    old = jit.set_enabled(False)  # dequantized per use: the dequantized weights' bits exactly
    try:
        exact, theirs = _logits(from_pretrained(path)), _logits(from_pretrained(folder))
    finally:
        jit.set_enabled(old)
    assert np.isfinite(exact).all()
    assert np.array_equal(exact, theirs)
    theirs = _logits(from_pretrained(folder))
    # multiplied in the blocks by the compiled kernels (engine.tensor.cpu.quant): float32 rounding
    ours = _logits(from_pretrained(path))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())


def test_every_weight_equals_the_gguf_packages_dequantization():
    model = from_pretrained(MIXED)
    names = pretrained_info(model).gguf_names  # Ember path -> GGUF name
    reader = gguf.GGUFReader(str(MIXED))
    seen = set()
    params = dict(tree_params(model))  # each parameter with its reparameterization
    for t in reader.tensors:
        ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        path = next(p for p, n in names.items() if n == t.name)
        value = params[path].val().numpy()
        if ref.ndim == 2 and t.name != "token_embd.weight":
            ref = ref.T
        assert value.dtype == np.float32
        assert np.array_equal(value.view(np.uint32), np.ascontiguousarray(ref).view(np.uint32)), t.name
        seen.add(t.tensor_type.name)
        quantized = t.tensor_type.name not in ("F32", "F16", "BF16")
        assert isinstance(params[path].reparameterization, GGUFWeight) == quantized, t.name
    assert seen == set(SUPPORTED_TYPES)


@pytest.mark.parametrize("qtype", [t for t in SUPPORTED_TYPES if t not in ("F32", "F16", "BF16")])
def test_random_blocks_read_from_a_file_dequantize_bit_for_bit_as_gguf(tmp_path, qtype):
    rng = np.random.default_rng(abs(hash(qtype)) % 2**32)
    blocks = maker.random_blocks(qtype, 8, 512, rng)
    path = tmp_path / "blocks.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x", blocks, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(path) as f:
        assert f.tensors["x"].type == qtype and f.tensors["x"].shape == (8, 512)
        ours = dequantize_blocks(f.read("x"), qtype).reshape(8, 512)
    ref = gguf.quants.dequantize(np.asarray(gguf.GGUFReader(str(path)).tensors[0].data),
                                 gguf.GGMLQuantizationType[qtype])
    assert np.isfinite(ours).all()
    assert np.array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


# ---------------------------------------------------------------------------------- lazy, quantized
def test_opening_reads_no_tensor_and_weights_stay_in_their_blocks():
    model = from_pretrained(MIXED)
    params = list(model.named_params())
    assert params and not any(p.is_initialized() for _, p in params)
    quantized = {path: p for path, p in params if path.endswith(".gguf.blocks.data")}
    assert len(quantized) == 13  # the 16 matrices less the F32, F16 and BF16 ones
    _logits(model)
    with open_gguf(MIXED) as f:
        for path, p in quantized.items():
            data = p.val().numpy()
            assert data.dtype == np.uint8
            name = pretrained_info(model).gguf_names[path.rsplit(".gguf.", 1)[0]]
            assert data.nbytes == f.tensors[name].nbytes
            assert not p.is_require_grad()


def test_the_metadata_gives_the_config():
    model = from_pretrained(QWEN)
    cfg = pretrained_info(model).config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (256, 1, 4, 2)
    assert cfg.tie_word_embeddings and cfg.attention_bias and cfg.rms_norm_eps == 2.0 ** -16
    assert pretrained_info(model).raw_config["eos_token_id"] == 2


# ---------------------------------------------------------------------------------- refusals
def _tiny_file(path: Path, arch: str = "llama", tensor_type: str | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    if tensor_type is None:
        w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    else:
        q = gguf.GGMLQuantizationType[tensor_type]
        block, size = gguf.GGML_QUANT_SIZES[q]
        w.add_tensor("token_embd.weight", np.zeros((4, 256 // block * size), dtype=np.uint8), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_unsupported_architecture_is_refused_naming_it(tmp_path):
    with pytest.raises(PretrainedError, match="unsupported GGUF architecture 'falcon'"):
        from_pretrained(_tiny_file(tmp_path / "g.gguf", "falcon"))


@pytest.mark.parametrize("qtype", ["IQ4_NL", "Q8_1", "TQ1_0"])
def test_an_unsupported_type_is_refused_naming_it(tmp_path, qtype):
    with pytest.raises(PretrainedError, match=f"stored as {qtype}, which Ember does not read"):
        from_pretrained(_tiny_file(tmp_path / "q.gguf", tensor_type=qtype))


def test_a_layer_count_the_tensors_do_not_have_is_refused(tmp_path):
    config = maker.tiny_config("llama", 2, 300)
    tensors = maker.tiny_hf_tensors(config, np.random.default_rng(1), tied=False, bias=False)
    path = tmp_path / "m.gguf"
    maker.write_gguf(path, "llama", dict(config, num_hidden_layers=3), tensors)
    with pytest.raises(PretrainedError, match="'num_hidden_layers' is 3"):
        from_pretrained(path)


def _patched(tmp_path: Path, offset: int, fmt: str, value) -> Path:
    raw = bytearray(MIXED.read_bytes())
    struct.pack_into(fmt, raw, offset, value)
    out = tmp_path / "hostile.gguf"
    out.write_bytes(bytes(raw))
    return out


def _key_offset(key: str) -> int:
    """The offset of metadata `key`'s value (after its name and its 4-byte type)."""
    raw = MIXED.read_bytes()
    at = raw.index(key.encode()) + len(key)
    return at + 4


@pytest.mark.parametrize("offset, fmt, value, message", [
    (8, "<Q", 2**40, "claims 1099511627776 tensors"),
    (16, "<Q", 2**40, "claims 1099511627776 metadata keys"),
    (24, "<Q", 2**40, "run past the end of the file"),   # the first key's length
])
def test_hostile_header_counts_are_refused_before_allocating(tmp_path, offset, fmt, value, message):
    with pytest.raises(GGUFError, match=message):
        open_gguf(_patched(tmp_path, offset, fmt, value))


@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"])
def test_an_array_length_in_the_billions_is_refused(tmp_path, key):
    with pytest.raises(GGUFError, match="past the end of the file|cannot fit the file"):
        open_gguf(_patched(tmp_path, _key_offset(key) + 4, "<Q", 3 * 10**9))


def test_a_string_length_in_the_billions_is_refused(tmp_path):
    # general.architecture's value: a string, its 8-byte length first
    with pytest.raises(GGUFError, match="past the end of the file"):
        open_gguf(_patched(tmp_path, _key_offset("general.architecture"), "<Q", 5 * 10**9))


def test_truncated_files_are_refused(tmp_path):
    raw = MIXED.read_bytes()
    end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(MIXED)).tensors)  # less the last padding
    rng = np.random.default_rng(3)
    cuts = sorted({0, 3, 10, 23, 24, 30, 200, end - 1, *rng.integers(0, end, 40).tolist()})
    for cut in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(raw[:cut])
        with pytest.raises(RecordError):
            open_gguf(path)


def test_corrupted_headers_give_a_record_error_or_a_file_that_reads(tmp_path):
    raw = MIXED.read_bytes()
    header_end = raw.index(b"output.weight") + 64
    rng = np.random.default_rng(5)
    errors = 0
    for i in range(150):
        mutated = bytearray(raw)
        for at in rng.integers(4, header_end, 3):
            mutated[at] = int(rng.integers(0, 256))
        path = tmp_path / "fuzz.gguf"
        path.write_bytes(bytes(mutated))
        try:
            open_gguf(path).close()
        except RecordError:
            errors += 1
    assert errors > 0


# ---------------------------------------------------------------------------------- tokenizer
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "café crème brûlée", "日本語 😀 emoji",
         "def add(a, b):\n    return a + b\n", "   spaces  and\ttabs\n\n", "0123456789 3.14159",
         "<|im_start|>user\nhi<|im_end|>", "unknown: ĳ ﬁ Ω"]


def test_the_tokenizer_encodes_and_decodes_as_the_one_it_was_written_from():
    from tokenizers import Tokenizer

    from engine.train.gguf_tokenizer import load_gguf_tokenizer

    ours = load_gguf_tokenizer(MIXED)
    ref = Tokenizer.from_file(str(FIXTURES / "tiny-tokenizer.json"))
    assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, 300)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text).ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
    ids = ours.encode("<|im_start|>user")
    assert ids[0] == 1 and "<|im_start|>" not in ours.decode(ids)


def test_the_chat_template_comes_from_the_metadata():
    from engine.train.gguf_tokenizer import gguf_chat_template

    template = gguf_chat_template(MIXED)
    text = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True).text
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_an_unsupported_tokenizer_model_is_refused_naming_it(tmp_path):
    from engine.train.gguf_tokenizer import load_gguf_tokenizer
    from engine.train.tokenizer import TokenizerError

    path = tmp_path / "sp.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("t5")
    w.add_token_list(["<unk>", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="tokenizer model 't5' is not supported"):
        load_gguf_tokenizer(path)


# ---------------------------------------------------------------------------------- LoRA over the blocks
@pytest.mark.parametrize("options", [{}, {"use_rslora": True}, {"use_dora": True}])
def test_lora_attaches_over_quantized_weights_keeping_their_blocks(options):
    from engine.models.gguf_weight import GGUFDoraAdapter, GGUFLoraAdapter, GGUFRsLoraAdapter
    from engine.module import Lora

    model = from_pretrained(MIXED)
    adapted = model.apply_lora(Lora(4, 8.0, **options))
    before, after = dict(tree_params(model)), dict(tree_params(adapted))
    kind = GGUFDoraAdapter if options.get("use_dora") else GGUFRsLoraAdapter if options else GGUFLoraAdapter
    over = {path: p for path, p in after.items() if isinstance(p.reparameterization, kind)}
    assert len(over) == 13  # every quantized matrix (Lora's default group: all rank-2 parameters)
    for path, p in over.items():
        assert after[f"{path}.lora.gguf.blocks.data"].val().numpy().dtype == np.uint8
        # b = 0: the value is the dequantized weight (bit for bit; DoRA rescales it by m / ||W|| = 1)
        ours, theirs = p.val().numpy(), before[path].val().numpy()
        if options.get("use_dora"):
            assert np.allclose(ours, theirs, rtol=1e-6, atol=0), path
        else:
            assert np.array_equal(ours, theirs), path
    trainable = sorted(path for path, p in adapted.named_params() if p.is_require_grad())
    assert trainable and all(path.rsplit(".", 2)[-2:][0] == "lora" for path in trainable)


def test_a_trained_adapter_changes_the_value_by_its_product_only():
    from engine.module import Lora

    model = from_pretrained(MIXED).apply_lora(Lora(2, 4.0))
    path = "layers.1.mlp.down_proj.weight"  # Q4_K
    params = dict(tree_params(model))
    p = params[path]
    base = p.val().numpy().copy()
    a = np.random.default_rng(0).standard_normal(p.reparameterization.a.shape).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(p.reparameterization.b.shape).astype(np.float32)
    from engine.module import Param

    r = p.reparameterization
    r.a, r.b = Param(Tensor.from_data(a)), Param(Tensor.from_data(b))
    expected = base + (a @ b) * np.float32(2.0)
    assert np.allclose(p.val().numpy(), expected, rtol=0, atol=1e-5)
    assert np.array_equal(r.gguf.base().numpy(), base)


def test_qlora_over_a_gguf_weight_is_refused():
    from engine.module import Lora, QLora
    from engine.module.reparam import ReparameterizationError

    with pytest.raises(ReparameterizationError, match="not a QLoRA adapter"):
        from_pretrained(MIXED).apply_qlora(QLora(Lora(2, 4.0)))


def test_save_pretrained_writes_the_dequantized_weights(tmp_path):
    from engine.models.save import save_pretrained

    model = from_pretrained(MIXED)
    save_pretrained(model, tmp_path / "out")
    assert np.array_equal(_logits(from_pretrained(tmp_path / "out")), _logits(model))


@pytest.mark.parametrize("name", ["tiny-llama-mixed.gguf", "tiny-spm.gguf"])
def test_the_tokenizer_gives_transformers_ids_and_texts(name):
    """tokenizer-expected.json: transformers' GGUF conversion of the same files (made by
    make_gguf_fixtures.py --expected in the oracle venv)."""
    from engine.train.gguf_tokenizer import load_gguf_tokenizer

    ref = json.loads((FIXTURES / "tokenizer-expected.json").read_text(encoding="utf-8"))[name]
    ours = load_gguf_tokenizer(FIXTURES / name)
    assert [ours.encode(t) for t in ref["texts"]] == ref["ids"]
    assert [ours.decode(ids, skip_special_tokens=False) for ids in ref["ids"]] == ref["decoded"]


def test_sentencepiece_merges_come_from_the_scores_best_first():
    from engine.train.gguf_tokenizer import merges_from_scores

    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0]
    # "ab" (score -1) first, then "bc" (-2), then "abc" (-3) split as a+bc and ab+c (by ids)
    assert merges_from_scores(tokens, scores) == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_lora_over_the_quantized_base_trains_the_factors_only():
    """A few Adam steps of next-token training: the loss falls, gradients reach the factors and
    nothing else, and the blocks are the file's bytes afterwards."""
    from engine import optim
    from engine.module import Lora

    model = from_pretrained(QWEN).apply_lora(Lora(4, 8.0))
    blocks_before = {path: p.val().numpy().copy() for path, p in model.named_params() if path.endswith("blocks.data")}
    ids = Tensor.from_data(IDS[:, :-1], dtype="int64")
    target = IDS[0, 1:]

    def loss_of(m):
        logits = m.forward(ids)  # [1, 7, vocab]
        logp = logits - logits.exp().sum_dim(2).log()
        picked = Tensor.from_data(np.eye(300, dtype=np.float32)[target][None])
        return -(logp * picked).sum() / len(target)

    opt = optim.AdamConfig().init()
    losses = []
    for step in range(4):
        loss = loss_of(model)
        losses.append(loss.item())
        grads = loss.backward()
        with_grad = [path for path, p in model.named_params() if p.is_initialized() and p.kind == "float"
                     and p.base().grad(grads) is not None]
        assert with_grad and all(".lora." in path for path in with_grad)
        model = opt.step(1e-2, model, optim.GradientsParams.from_grads(grads, model))
    assert losses[-1] < losses[0]
    for path, p in model.named_params():
        if path.endswith("blocks.data"):
            assert np.array_equal(p.val().numpy(), blocks_before[path]), path


def test_memory_estimates_count_the_blocks_at_a_byte_each():
    from engine.module import memory

    model = from_pretrained(MIXED)
    with open_gguf(MIXED) as f:
        for path, p in model.named_params():
            if path.endswith("blocks.data"):
                name = pretrained_info(model).gguf_names[path.rsplit(".gguf.", 1)[0]]
                assert memory.param_bytes(p) == f.tensors[name].nbytes  # before anything is read


@pytest.mark.parametrize("key, value, message", [
    ("general.type", "adapter", "a GGUF 'adapter' \\(general.type\\), not a model"),
    ("llama.expert_count", 8, "metadata 'llama.expert_used_count' is missing"),  # a Mixtral needs it
    ("llama.rope.dimension_count", 32, "covers part of each head of 64"),
])
def test_what_the_llama_family_does_not_build_is_refused_naming_it(tmp_path, key, value, message):
    config = maker.tiny_config("llama", 1, 300)
    tensors = maker.tiny_hf_tensors(config, np.random.default_rng(2), tied=False, bias=False)
    path = tmp_path / "m.gguf"
    maker.write_gguf(path, "llama", config, tensors)
    raw = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "edited.gguf"), "llama")
    for name, field in raw.fields.items():  # the same metadata, one key set to `value`
        if name.startswith("GGUF.") or name == "general.architecture" or name == key:
            continue
        w.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    if isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_uint32(key, value)
    for t in raw.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PretrainedError, match=message):
        from_pretrained(tmp_path / "edited.gguf")


def test_a_big_endian_file_is_refused(tmp_path):
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="big-endian"):
        open_gguf(path)


def test_float16_parameters_on_request():
    ours = from_pretrained(QWEN, dtype="float16")
    value = dict(tree_params(ours))["layers.0.mlp.up_proj.weight"].val()
    ref = dict(tree_params(from_pretrained(QWEN)))["layers.0.mlp.up_proj.weight"].val().numpy()
    assert value.dtype.name == "float16" and np.array_equal(value.numpy(), ref.astype(np.float16))


def test_each_weights_stored_type_and_bytes_are_known_without_reading():
    from engine.models.gguf_model import gguf_storage

    model = from_pretrained(MIXED).apply_lora(Lora_(2))  # kept through transitions
    storage = gguf_storage(model)
    reader = gguf.GGUFReader(str(MIXED))
    assert sorted(n for n, _, _ in storage.values()) == sorted(t.name for t in reader.tensors)
    for t in reader.tensors:
        path = next(p for p, (n, _, _) in storage.items() if n == t.name)
        assert storage[path][1:] == (t.tensor_type.name, int(t.n_bytes))
    assert gguf_storage(from_pretrained(FIXTURES.parents[0] / "hf" / "llama-gqa")) == {}


def Lora_(rank):
    from engine.module import Lora

    return Lora(rank, 2.0 * rank)


def test_a_peft_adapter_of_a_gguf_model_uses_hugging_face_names_and_loads_back(tmp_path):
    from safetensors.numpy import load_file

    from engine.models import load_peft_adapter
    from engine.models.gguf_weight import GGUFLoraAdapter
    from engine.models.peft import save_peft_adapter
    from engine.module import Lora, ParamGroup

    tuned = from_pretrained(QWEN).apply_lora(Lora(2, 4.0, param_group=ParamGroup.from_regex(r"self_attn")))
    for _, p in tree_params(tuned):  # a trained-looking adapter: b != 0
        if isinstance(p.reparameterization, GGUFLoraAdapter):
            r = p.reparameterization
            r.b = type(r.b)(Tensor.from_data(np.random.default_rng(0).standard_normal(r.b.shape).astype(np.float32)))
    save_peft_adapter(tuned, tmp_path / "adapter")
    keys = sorted(load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    loaded = load_peft_adapter(from_pretrained(QWEN), tmp_path / "adapter")
    assert {type(p.reparameterization) for _, p in tree_params(loaded) if "self_attn" in _} == {GGUFLoraAdapter, type(None)}
    assert np.allclose(_logits(loaded), _logits(tuned), rtol=1e-5, atol=1e-5)


def test_the_lora_preview_counts_quantized_weights_as_targets():
    from engine.module import Lora
    from engine.module.summary import trainable_counts

    model = from_pretrained(MIXED)
    preview = Lora(4, 8.0).preview(model)
    assert len(preview.targets) == 16 and not preview.nested
    assert preview.counts == trainable_counts(model.apply_lora(Lora(4, 8.0)))


def test_opening_can_be_cancelled_between_layers():
    class Cancelled(Exception):
        pass

    calls = []

    def check():
        calls.append(1)
        if len(calls) > 5:
            raise Cancelled

    with pytest.raises(Cancelled):
        from_pretrained(MIXED, check=check)
    assert len(calls) == 6


def test_a_record_of_a_tuned_gguf_model_holds_the_blocks_and_loads_back(tmp_path):
    from engine.module import Lora
    from engine.store import ModuleRecord

    tuned = from_pretrained(QWEN).apply_lora(Lora(2, 4.0))
    for _, p in tree_params(tuned):
        if p.reparameterization is not None and hasattr(p.reparameterization, "b"):
            r = p.reparameterization
            r.b = type(r.b)(Tensor.from_data(np.full(r.b.shape, 0.01, dtype=np.float32)))
    record = tuned.into_record()
    assert "layers.0.mlp.up_proj.weight.lora.gguf.blocks.data" in record.names()
    assert "layers.0.mlp.up_proj.weight" not in record.names()  # the placeholder is no tensor
    record.save(tmp_path / "tuned.bpk")
    loaded = from_pretrained(QWEN).apply_lora(Lora(2, 4.0)).load_record(ModuleRecord.load(tmp_path / "tuned.bpk"))
    assert np.array_equal(_logits(loaded), _logits(tuned))
