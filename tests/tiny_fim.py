"""A tiny random Qwen2 model whose vocabulary has Qwen2.5-Coder's fill-in-the-middle tokens,
as a Hugging Face folder and a GGUF file: the tiny tokenizer of `tiny_models` (its specials
``<|endoftext|>`` 381, ``<|im_start|>`` 382, ``<|im_end|>`` 383, the eos) with the six FIM
tokens appended as special added tokens, ids 384-389 in Qwen's order."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tiny_models import EOS_TOKEN, PAD_TOKEN, _randomize_, hf_to_gguf, make_config, save_tokenizer

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>")
PREFIX, MIDDLE, SUFFIX, PAD, REPO, FILE_SEP = range(384, 390)
ENDOFTEXT, IM_END = 381, 383


def _add_fim_tokens(out_dir: Path, first_id: int) -> None:
    path = out_dir / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    tok["added_tokens"] += [{"id": first_id + i, "content": text, "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": True} for i, text in enumerate(FIM_TOKENS)]
    path.write_text(json.dumps(tok), encoding="utf-8")


def make_fim_hf_model(out_dir: str | Path, seed: int = 0) -> Path:
    """The tiny FIM model as a Hugging Face folder (generation_config's eos: ``<|im_end|>``
    only, as Qwen2.5-Coder-Instruct's)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    assert len(tokenizer) == PREFIX
    _add_fim_tokens(out_dir, PREFIX)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = make_config("qwen2", PREFIX + len(FIM_TOKENS), eos_id, pad_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.save_pretrained(str(out_dir))
    return out_dir


def make_fim_gguf(hf_dir: Path, out_path: Path) -> Path:
    """The same model as an F32 GGUF file (the FIM tokens typed CONTROL)."""
    return hf_to_gguf(hf_dir, out_path, "F32")
