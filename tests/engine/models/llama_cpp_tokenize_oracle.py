"""Run by the oracle venv's Python (tests/engine/models/test_gguf_hf_tokenizer.py): llama.cpp's and
transformers' tokenization of the same lines, a GGUF file's against the Hugging Face folder it was
exported from.

    python llama_cpp_tokenize_oracle.py MODEL.gguf FOLDER TEXTS.json [file]

prints one JSON object: {"llama_cpp": [ids of each line], "transformers": [ids of each line],
"chat": transformers' chat template rendered for one question with the generation prompt}, each
line tokenized as the model's users do: special tokens in the text recognised, the bos / eos
tokens added as the tokenizer says (llama.cpp: `add_special`, `parse_special`; transformers: the
tokenizer called on the text). With `file`, transformers runs the folder's tokenizer.json as it is
(`PreTrainedTokenizerFast(tokenizer_file=...)`): `AutoTokenizer` gives some model types (Qwen2) their
class's own pre-tokenizer whatever the file says.
"""
import json
import sys

from llama_cpp import Llama
from transformers import AutoTokenizer, PreTrainedTokenizerFast

model, folder, texts = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3], encoding="utf-8"))
llm = Llama(model_path=model, vocab_only=True, verbose=False)
if sys.argv[4:] == ["file"]:
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{folder}/tokenizer.json")
else:
    tok = AutoTokenizer.from_pretrained(folder)
print(json.dumps({"llama_cpp": [llm.tokenize(t.encode("utf-8"), add_bos=True, special=True) for t in texts],
                  "transformers": [tok(t)["input_ids"] for t in texts],
                  "chat": None if tok.chat_template is None else tok.apply_chat_template(
                      [{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
                      add_generation_prompt=True)}))
