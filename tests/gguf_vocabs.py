"""Tiny metadata-only GGUF files with real vocabularies, trained by the tests themselves.

* ``write_spm_gguf``: a SentencePiece model (BPE or Unigram, byte fallback) trained with the
  ``sentencepiece`` package, written as llama.cpp's converter writes one (``llama`` model:
  pieces, scores, token types, special ids, add_bos/add_eos/add_space_prefix).
* ``write_bpe_gguf``: a byte-level BPE vocabulary trained with ``tokenizers`` on the pieces of a
  given pre-tokenizer, written as a ``gpt2`` model with merges.

Every file carries a few llama hyper-parameters so transformers can read its config too.
"""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "It's, don't, I'm, we'll, they've -- 3.14159 and 1,000,000 items.",
    "Café naïve résumé Ångström façade jalapeño Straße øre.",
    "日本語のテキストです。你好，世界！中文文本和汉字。",
    "한국어 텍스트 Россия Ελληνικά עברית",
    "مرحبا بالعالم، هذا نص عربي قصير.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।",
    "emoji 😀🎉👍🏽👨‍👩‍👧 🏳️‍🌈 ok 🚀🔥",
    "def f(x):\n\treturn x ** 2  # square\n",
    "class A:\n    def __init__(self):\n        self.items = [1, 2, 3]\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "multiple   internal    spaces\t\ttabs\n\n\nnewlines\r\n",
    "  leading spaces and trailing spaces   ",
    "<think>reasoning</think> the answer is 42",
]
# Text with characters the tiny vocabularies never saw: byte fallback spells them.
RARE = ["𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ⚗️ ∮ ☃ 𓀀", "ǅ ǈ ǋ Ꭰ ꙮ 🦩🧿", "Zürich → Genève ≈ 1½ km²"]


def _add_llama_hparams(writer: gguf.GGUFWriter) -> None:
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-6)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def train_sentencepiece(model_type: str, *, vocab_size: int = 700, add_dummy_prefix: bool = True,
                        user_defined: tuple[str, ...] = ("<think>", "</think>"),
                        control: tuple[str, ...] = ("<|turn|>",),
                        gemma_names: bool = False) -> spm.SentencePieceProcessor:
    """A SentencePiece model trained on ``CORPUS`` (identity normalization, spaces kept).
    ``gemma_names``: special pieces named as Gemma's (``<bos>``, ``<eos>``, ``<pad>``, and a
    ``<mask>``), which transformers' Gemma tokenizer otherwise adds."""
    model = io.BytesIO()
    names = {}
    if gemma_names:
        names = dict(bos_piece="<bos>", eos_piece="<eos>", pad_piece="<pad>")
        control = (*control, "<mask>")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, model_type=model_type,
        vocab_size=vocab_size, byte_fallback=True, character_coverage=0.995,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix, allow_whitespace_only_pieces=True,
        split_digits=True, hard_vocab_limit=False, pad_id=3,
        user_defined_symbols=list(user_defined), control_symbols=list(control),
        minloglevel=2, **names)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def spm_token_type(sp: spm.SentencePieceProcessor, i: int, user_defined: set[str]) -> int:
    """llama.cpp's token type of piece ``i`` (its SentencePiece converter's rules)."""
    if sp.is_unknown(i):
        return gguf.TokenType.UNKNOWN
    if sp.is_control(i):
        return gguf.TokenType.CONTROL
    if sp.is_unused(i):
        return gguf.TokenType.UNUSED
    if sp.is_byte(i):
        return gguf.TokenType.BYTE
    if sp.id_to_piece(i) in user_defined:
        return gguf.TokenType.USER_DEFINED
    return gguf.TokenType.NORMAL


def write_spm_gguf(path: Path, sp: spm.SentencePieceProcessor, *, arch: str = "llama",
                   add_bos: bool = True, add_eos: bool = False, add_space_prefix: bool = True,
                   spaces_as_spaces: bool = False,
                   user_defined: tuple[str, ...] = ("<think>", "</think>")) -> Path:
    """``sp`` as a ``llama`` tokenizer GGUF. ``spaces_as_spaces``: write pieces made only of
    ``▁`` with real spaces, as Gemma's files do."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if spaces_as_spaces:
        pieces = [" " * len(p) if p and not p.strip("\u2581") else p for p in pieces]
    writer = gguf.GGUFWriter(str(path), arch=arch)
    _add_llama_hparams(writer)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(pieces)
    writer.add_token_scores([sp.get_score(i) for i in range(len(pieces))])
    writer.add_token_types([spm_token_type(sp, i, set(user_defined)) for i in range(len(pieces))])
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_pad_token_id(sp.pad_id())
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    writer.add_add_space_prefix(add_space_prefix)
    _finish(writer)
    return path


def train_byte_level_bpe(pre_tokenizer: pre_tokenizers.PreTokenizer,
                         vocab_size: int = 600) -> HFTokenizer:
    """A byte-level BPE vocabulary learned on ``CORPUS`` as ``pre_tokenizer`` cuts it."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|begin|>", "<|endoftext|>", "<|eot|>"])
    tok.train_from_iterator(CORPUS * 5, trainer)
    return tok


def write_bpe_gguf(path: Path, tok: HFTokenizer, pre: str, *, add_bos: bool = True) -> Path:
    """``tok`` as a ``gpt2`` tokenizer GGUF with ``tokenizer.ggml.pre = pre``; its special
    tokens control, plus a user-defined ``<tool>``."""
    import json

    state = json.loads(tok.to_str())
    vocab = state["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + ["<tool>"]
    special = {"<|begin|>", "<|endoftext|>", "<|eot|>"}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
             for t in tokens[:-1]] + [gguf.TokenType.USER_DEFINED]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    _add_llama_hparams(writer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|begin|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eot_token_id(tokens.index("<|eot|>"))
    writer.add_add_bos_token(add_bos)
    _finish(writer)
    return path
