"""Tokenizers from GGUF metadata for every vocabulary kind, checked against transformers'
tokenizer read from the same file (``AutoTokenizer.from_pretrained(dir, gguf_file=name)``).

Tiny vocabularies are trained here (``gguf_vocabs``): SentencePiece BPE and Unigram models
written as llama.cpp writes a ``llama`` tokenizer, and byte-level BPE ones per
``tokenizer.ggml.pre``. The real Gemma 3 270M file (262k pieces) is checked on the same texts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import regex
from gguf_vocabs import (
    CORPUS,
    RARE,
    train_byte_level_bpe,
    train_sentencepiece,
    write_bpe_gguf,
    write_spm_gguf,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from real_models import gemma3_270m, one_reader

from radixserve.tokenizer.byte_pieces import ByteLevelDetokenizer, _byte_of_char
from radixserve.tokenizer.detokenizer import IncrementalDetokenizer
from radixserve.tokenizer.gguf_pre_tokenizers import (
    _DEEPSEEK_CODER,
    _DEEPSEEK_LLM,
    _DEEPSEEK_V3,
    gguf_pre_tokenizer,
)
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer
from radixserve.models.source import ModelSource

transformers = pytest.importorskip("transformers")

EXTRA = ["", "x", "a  b", "trailing\n", "a<think>b</think> c", "tabs\t\t\tand\n\n\n\nruns     x",
         "<|turn|>user\nhi<|turn|>", "<s>x</s>", "<bos>x<eos>", "Ünïcödé — “quotes” … ½ ①"]
TEXTS = CORPUS + RARE + EXTRA
# decode(encode(x)) == x for these: no special tokens (decode drops them by default)
PLAIN = [t for t in TEXTS if not any(s in t for s in ("<s>", "<bos>", "<|turn|>"))]

# (SentencePiece model type, architecture, add_space_prefix, Gemma-style space pieces)
SPM_CASES = [("bpe", "llama", True, False), ("unigram", "llama", True, False),
             ("bpe", "gemma3", False, True), ("unigram", "gemma3", False, True)]


def _reference(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _write_spm(root: Path, model_type: str, arch: str, prefix: bool, spaces: bool) -> Path:
    sp = train_sentencepiece(model_type, add_dummy_prefix=prefix, gemma_names=arch == "gemma3")
    folder = root / f"{model_type}-{arch}"
    folder.mkdir()
    return write_spm_gguf(folder / "tok.gguf", sp, arch=arch, add_space_prefix=prefix,
                          spaces_as_spaces=spaces)


@pytest.fixture(scope="module", params=SPM_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def spm_pair(request, tmp_path_factory) -> tuple[Tokenizer, object, tuple]:
    path = _write_spm(tmp_path_factory.mktemp("spm"), *request.param)
    return Tokenizer.from_gguf(path), _reference(path), request.param


def test_spm_matches_transformers(spm_pair) -> None:
    ours, ref, _ = spm_pair
    assert ours.vocab_size == len(ref)
    mine, theirs = (json.loads(t.to_str())["model"] for t in (ours.backend, ref.backend_tokenizer))
    assert (mine["vocab"], mine["merges"]) == (theirs["vocab"], theirs["merges"])
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id, ours.pad_token_id) == (
        ref.bos_token_id, ref.eos_token_id, ref.unk_token_id, ref.pad_token_id)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        assert ours.encode(text, add_special_tokens=False) == ref(
            text, add_special_tokens=False).input_ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip)


def test_spm_special_and_added_tokens(spm_pair) -> None:
    ours, _, (_, arch, prefix, _) = spm_pair
    ids = ours.encode("<|turn|>user<think>x</think>")
    assert ids[0] == ours.bos_token_id == 1  # add_bos_token
    turn, think = ours.backend.token_to_id("<|turn|>"), ours.backend.token_to_id("<think>")
    assert ids[1] == turn and think in ids
    assert turn in ours.all_special_ids and think not in ours.all_special_ids
    assert ours.decode(ids) == "user<think>x</think>"
    bos, eos = ("<bos>", "<eos>") if arch == "gemma3" else ("<s>", "</s>")
    assert ours.special_tokens == {"bos_token": bos, "eos_token": eos, "unk_token": "<unk>",
                                   "pad_token": "<pad>"}
    assert ours.eos_token_ids == {2}
    # the prefix space is written as ▁ on the first piece only when the file asks for it
    first = ours.convert_ids_to_tokens(ours.encode("Hello", add_special_tokens=False))[0]
    assert first.startswith("\u2581") == prefix


def test_spm_round_trip_and_byte_fallback(spm_pair) -> None:
    ours, _, (_, arch, prefix, _) = spm_pair
    byte_ids = {ours.backend.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    assert None not in byte_ids
    for text in PLAIN:
        if prefix and text[:1].isspace():
            continue  # Metaspace (as transformers) does not add ▁ before a leading space
        assert ours.decode(ours.encode(text)) == text, text
    assert all(byte_ids & set(ours.encode(text)) for text in RARE)


def test_spm_gemma_style_bpe_equals_sentencepiece(tmp_path: Path) -> None:
    """With no prefix space and a BPE model, merges rebuilt from the token order are the
    trained model's own: the ids are sentencepiece's (special-token-free text)."""
    sp = train_sentencepiece("bpe", add_dummy_prefix=False)
    tok = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "g.gguf", sp, arch="gemma3",
                                             add_space_prefix=False, spaces_as_spaces=True))
    for text in CORPUS + RARE:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text), text


def test_spm_flags_from_metadata(tmp_path: Path) -> None:
    sp = train_sentencepiece("bpe")
    tok = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "e.gguf", sp, add_bos=False,
                                             add_eos=True))
    ids = tok.encode("hi there")
    assert ids[0] != sp.bos_id() and ids[-1] == sp.eos_id()
    no_prefix = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "n.gguf", sp,
                                                   add_space_prefix=False))
    assert no_prefix.convert_ids_to_tokens(no_prefix.encode("hi there"))[1] == "h"
    assert no_prefix.decode(no_prefix.encode(" hi")) == " hi"


def _stream(tok: Tokenizer, ids: list[int], sizes, prompt=(), skip: bool = True) -> list[str]:
    detok = tok.detokenizer(list(prompt), skip_special_tokens=skip)
    deltas, position = [], 0
    while position < len(ids):
        size = next(sizes)
        deltas.append(detok.step(ids[position:position + size]))
        position += size
    return deltas + [detok.flush()]


def test_spm_streaming_equals_decode(spm_pair) -> None:
    ours, _, _ = spm_pair
    assert isinstance(ours.detokenizer([]), ByteLevelDetokenizer)
    rng = random.Random(0)
    for text in TEXTS:
        ids = ours.encode(text)
        for sizes in (iter(lambda: 1, None), iter(lambda: rng.randint(1, 4), None)):
            deltas = _stream(ours, ids, sizes)
            assert "".join(deltas) == ours.decode(ids), text
            assert not any("\ufffd" in d for d in deltas), text
            generic = IncrementalDetokenizer(ours, [])
            assert "".join([generic.step([i]) for i in ids] + [generic.flush()]) == ours.decode(
                ids)


def test_spm_streaming_holds_split_characters(spm_pair) -> None:
    ours, _, _ = spm_pair
    ids = ours.encode("𓀀", add_special_tokens=False)
    tokens = ours.convert_ids_to_tokens(ids)
    assert tokens[-4:] == ["<0xF0>", "<0x93>", "<0x80>", "<0x80>"]
    detok = ours.detokenizer([])
    assert [detok.step([i]) for i in ids[-4:]] == ["", "", "", "𓀀"]
    cut = ours.detokenizer([])
    assert cut.step(ids[-4:-1]) == "" and cut.flush() == "\ufffd"


def test_spm_streaming_continues_the_prompt(spm_pair) -> None:
    """After a text prompt an output's first space is kept (decode(prompt + output) minus
    decode(prompt)); at the start of a text it goes, as in decode(output)."""
    ours, _, (_, _, prefix, _) = spm_pair
    prompt = ours.encode("The answer is")
    out = ours.encode(" the fox", add_special_tokens=False)
    continued = "".join(_stream(ours, out, iter(lambda: 1, None), prompt=prompt))
    whole = ours.decode(prompt + out)
    assert continued == whole[len(ours.decode(prompt)):] == " the fox"
    fresh = "".join(_stream(ours, out, iter(lambda: 1, None), prompt=[ours.bos_token_id]))
    assert fresh == ours.decode(out)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=24), seed=st.integers(0, 2**16))
def test_spm_streaming_random_text(spm_pair, text: str, seed: int) -> None:
    ours, _, _ = spm_pair
    rng = random.Random(seed)
    ids = ours.encode(text, add_special_tokens=False)
    deltas = _stream(ours, ids, iter(lambda: rng.randint(1, 3), None))
    assert "".join(deltas) == ours.decode(ids)
    assert "\ufffd" not in "".join(deltas) or "\ufffd" in text


# --- byte-level BPE per tokenizer.ggml.pre ---------------------------------------------------

BPE_VS_TRANSFORMERS = ["default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "tekken", "gpt-4o"]


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bpe")
    files = {}
    for pre in [*BPE_VS_TRANSFORMERS, "smollm", "deepseek-llm", "deepseek-coder", "deepseek-v3"]:
        folder = root / pre
        folder.mkdir()
        files[pre] = write_bpe_gguf(folder / "tok.gguf",
                                    train_byte_level_bpe(gguf_pre_tokenizer(pre)), pre)
    return files


@pytest.mark.parametrize("pre", BPE_VS_TRANSFORMERS)
def test_bpe_pre_tokenizer_matches_transformers(bpe_files, pre: str) -> None:
    ours, ref = Tokenizer.from_gguf(bpe_files[pre]), _reference(bpe_files[pre])
    assert ours.vocab_size == len(ref)
    for text in TEXTS + ["<|begin|>x<tool>y<|eot|>"]:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(
            ids, skip_special_tokens=False)
        if text in PLAIN:
            assert ours.decode(ids) == text


def _llama_cpp_splits(text: str, patterns: tuple[str, ...]) -> list[str]:
    """llama.cpp's unicode_regex_split, written again with Python's ``regex``: each pattern
    cuts every piece so far into its matches and the text between them."""
    pieces = [text]
    for pattern in patterns:
        cut = []
        for piece in pieces:
            start = 0
            for match in regex.finditer(pattern, piece):
                cut += [piece[start:match.start()], match.group()]
                start = match.end()
            cut.append(piece[start:])
        pieces = [p for p in cut if p]
    return pieces


@pytest.mark.parametrize("pre, patterns", [("deepseek-llm", _DEEPSEEK_LLM),
                                           ("deepseek-coder", _DEEPSEEK_CODER),
                                           ("deepseek-v3", _DEEPSEEK_V3)])
def test_bpe_deepseek_splits_as_llama_cpp(bpe_files, pre: str, patterns) -> None:
    """transformers has no split for these (it falls back to GPT-2's), so the pieces are
    checked against the regex chain run by another engine, and the ids round-trip."""
    byte_of = _byte_of_char()
    char_of = {b: c for c, b in byte_of.items()}
    tok = Tokenizer.from_gguf(bpe_files[pre])
    for text in TEXTS + ["a   b\n\n  c  ", "x123456y ２３ ١٢٣"]:
        pieces = [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]
        expected = ["".join(char_of[b] for b in p.encode()) for p in
                    _llama_cpp_splits(text, patterns)]
        assert pieces == expected, text
        if text in PLAIN:
            assert tok.decode(tok.encode(text)) == text


def test_bpe_smollm_isolates_digits(bpe_files) -> None:
    tok = Tokenizer.from_gguf(bpe_files["smollm"])
    pieces = [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str("x 123")]
    assert pieces == ["x", "Ġ", "1", "2", "3"]


def test_unsupported_model_and_pre(tmp_path: Path, bpe_files) -> None:
    import gguf

    for key, value, names in (("tokenizer.ggml.model", "rwkv", "gemma4.*gpt2.*llama"),
                              ("tokenizer.ggml.pre", "mystery-pre", "deepseek-coder.*qwen2")):
        writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch="llama")
        reader = gguf.GGUFReader(bpe_files["qwen2"])
        for name, field in reader.fields.items():
            if name.startswith("tokenizer."):
                contents = value if name == key else field.contents()
                vtype = field.types[0]
                sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(name, contents, vtype, sub_type=sub)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        with pytest.raises(ValueError, match=f"{value!r}.*supported.*{names}"):
            Tokenizer.from_gguf(tmp_path / "bad.gguf")


def test_load_tokenizer_reads_spm_gguf(tmp_path: Path) -> None:
    path = write_spm_gguf(tmp_path / "m.gguf", train_sentencepiece("bpe"))
    tok = load_tokenizer(ModelSource.resolve(str(path)))
    assert tok.convert_ids_to_tokens(tok.encode("Hello")) == ["<s>", "\u2581Hello"]


# --- the real Gemma 3 270M -------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma() -> tuple[Tokenizer, object]:
    try:
        path = Path(gemma3_270m())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with one_reader(str(path)):
        return Tokenizer.from_gguf(path), _reference(path)


def test_gemma3_matches_transformers(gemma) -> None:
    ours, ref = gemma
    assert ours.vocab_size == len(ref) == 262144
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (2, 1, 0)
    texts = TEXTS + ["<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
                     "<unused3> [multimodal] \u00a0\u3000 \x00\x01"]
    for text in texts:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(
            ids, skip_special_tokens=False)
        if text in PLAIN:
            assert ours.decode(ids) == text
    assert set(ref.all_special_ids) <= ours.all_special_ids


def test_gemma3_streams_and_has_no_chat_template(gemma) -> None:
    ours, _ = gemma
    rng = random.Random(1)
    for text in PLAIN:
        ids = ours.encode(text, add_special_tokens=False)
        deltas = _stream(ours, ids, iter(lambda: rng.randint(1, 3), None),
                         prompt=[ours.bos_token_id])
        assert "".join(deltas) == ours.decode(ids) == text
        assert not any("\ufffd" in d for d in deltas)
    # a base model: completions work, a chat request gets a clear error
    assert ours.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        ours.apply_chat_template([{"role": "user", "content": "hi"}])

