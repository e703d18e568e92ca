"""Checks of the tiny-model builders: the HF folders, and GGUF files read back by transformers."""

from __future__ import annotations

import functools
import json

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tiny_models import (
    ARCHS,
    CHATML_TEMPLATE,
    GGUF_TOKENIZER_PRE,
    SPECIAL_TOKENS,
    hf_to_gguf,
    llama3_rope_factors,
    load_gguf_model,
    make_hf_model,
    permute_qk,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

TEXTS = (
    "Hello world, it's 2025!",
    "  The quick brown fox\n\njumps over the lazy dog...",
    "We're caching the radix tree; they've 12345 tokens:\tdone.",
    "ünïcödé 😀 — mixed 日本語 text",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "",
)

# Max |logit difference| to the fp32 model (logits have std ~0.8): F16 rounding is tiny, Q8_0
# moves logits by a few hundredths, Q4_0 by up to ~1 (checked through correlation instead).
LOOSE_ATOL = {"F16": 1e-2, "Q8_0": 0.2}


def _token_sequences(vocab_size: int) -> list[list[int]]:
    """A few inputs: one token, a short and a longer random run, and a ChatML-shaped run
    (ids vocab-2 / vocab-1 are <|im_start|> / <|im_end|>)."""
    gen = torch.Generator().manual_seed(0)
    return [
        [7],
        torch.randint(0, vocab_size, (5,), generator=gen).tolist(),
        torch.randint(0, vocab_size, (40,), generator=gen).tolist(),
        [vocab_size - 2, 80, 83, 72, vocab_size - 1, 198, vocab_size - 2, 65],
    ]


@torch.no_grad()
def _logits(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    return [model(torch.tensor([seq])).logits[0] for seq in sequences]


def _load_hf(hf_dir):
    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


def _assert_logits_close(got, want, atol: float) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=0)


def _roundtrip_weights_(model, ftype: str) -> None:
    """Put 2-D weights through the GGUF `ftype` encoding, as the file stores them."""
    qtype = gguf.GGMLQuantizationType[ftype]
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim != 2:
                continue
            w = param.numpy()
            if ftype == "F16":
                back = w.astype(np.float16).astype(np.float32)
            else:
                back = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
            param.copy_(torch.from_numpy(np.ascontiguousarray(back)))


def _gguf_config_gap(hf_dir, gguf_path) -> str | None:
    """Why transformers' config rebuilt from the GGUF differs from the HF one, or None."""
    want = AutoConfig.from_pretrained(str(hf_dir))
    got = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    fields = (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
        "rms_norm_eps", "tie_word_embeddings",
    )  # fmt: skip

    def value(config, field):  # qwen2 configs derive head_dim instead of storing it
        if field == "head_dim" and getattr(config, "head_dim", None) is None:
            return config.hidden_size // config.num_attention_heads
        return getattr(config, field, None)

    gaps = [
        f"{f}={value(got, f)} (want {value(want, f)})"
        for f in fields
        if value(got, f) != pytest.approx(value(want, f), rel=1e-6)  # eps is stored as f32
    ]
    return ", ".join(gaps) or None


def _read_gguf(path) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """(metadata key -> python value, tensor name -> dequantized array, tensor name -> type)."""
    reader = gguf.GGUFReader(str(path))
    meta = {name: field.contents() for name, field in reader.fields.items()}
    arrays, types = {}, {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        arrays[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        types[t.name] = t.tensor_type.name
    return meta, arrays, types


# --------------------------------------------------------------------------------------------
# Hugging Face folders
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_folder(arch, tiny_hf_dirs):
    hf_dir = tiny_hf_dirs[arch]
    for name in ("config.json", "model.safetensors", "generation_config.json",
                 "tokenizer.json", "tokenizer_config.json"):  # fmt: skip
        assert (hf_dir / name).is_file(), name
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == arch
    shape = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    assert [config[k] for k in shape] == [64, 4, 2, 16]
    assert config["num_hidden_layers"] == 2 and config["intermediate_size"] == 128

    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHATML_TEMPLATE
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["bos_token"] is None

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    assert len(tokenizer) == config["vocab_size"]
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(
        range(len(tokenizer) - 3, len(tokenizer))
    )
    assert config["eos_token_id"] == tokenizer.eos_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text

    model = _load_hf(hf_dir)
    params = dict(model.named_parameters())
    norm = params["model.layers.0.input_layernorm.weight"]
    assert not torch.allclose(norm, torch.ones_like(norm)) and abs(norm.mean().item() - 1) < 0.1
    if arch == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in params
    if arch == "qwen3":
        assert "model.layers.0.self_attn.q_norm.weight" in params
    assert ("lm_head.weight" in params) == (not model.config.tie_word_embeddings)
    logits = _logits(model, _token_sequences(config["vocab_size"]))[2]
    assert 0.3 < logits.std().item() < 3  # neither flat nor saturated


def test_make_hf_model_is_deterministic(tmp_path, tiny_hf_dirs):
    same = make_hf_model("qwen2", tmp_path / "same", seed=0)
    other = make_hf_model("qwen2", tmp_path / "other", seed=1)
    base = _load_hf(tiny_hf_dirs["qwen2"]).state_dict()
    for key, value in _load_hf(same).state_dict().items():
        torch.testing.assert_close(value, base[key], atol=0, rtol=0)
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(_load_hf(other).state_dict()[w], base[w])


# --------------------------------------------------------------------------------------------
# GGUF files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_metadata_and_tensors(arch, tiny_hf_dirs, tiny_gguf_files):
    hf_dir = tiny_hf_dirs[arch]
    config = json.loads((hf_dir / "config.json").read_text())
    meta, arrays, types = _read_gguf(tiny_gguf_files[arch, "F32"])

    assert meta["general.architecture"] == arch
    assert meta["general.file_type"] == gguf.LlamaFileType.ALL_F32
    expected = {
        "block_count": 2, "context_length": 512, "embedding_length": 64,
        "feed_forward_length": 128, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 16, "attention.value_length": 16, "rope.dimension_count": 16,
        "vocab_size": config["vocab_size"],
    }  # fmt: skip
    for key, value in expected.items():
        assert meta[f"{arch}.{key}"] == value, key
    assert meta[f"{arch}.rope.freq_base"] == pytest.approx(10000.0)
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)

    tok_json = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens = meta["tokenizer.ggml.tokens"]
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == GGUF_TOKENIZER_PRE
    assert len(tokens) == config["vocab_size"]
    assert all(tokens[i] == tok for tok, i in tok_json["model"]["vocab"].items())
    types_ = meta["tokenizer.ggml.token_type"]
    for special in SPECIAL_TOKENS:
        assert types_[tokens.index(special)] == gguf.TokenType.CONTROL
    assert types_.count(gguf.TokenType.NORMAL) == len(tokens) - len(SPECIAL_TOKENS)
    assert meta["tokenizer.ggml.merges"][0] == " ".join(tok_json["model"]["merges"][0])
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
    assert tokens[meta["tokenizer.ggml.padding_token_id"]] == "<|endoftext|>"
    assert "tokenizer.ggml.bos_token_id" not in meta
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.chat_template"] == CHATML_TEMPLATE

    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down"}  # fmt: skip
    per_layer_bias = {"qwen2": {"attn_q", "attn_k", "attn_v"}}.get(arch, set())
    if arch == "qwen3":
        per_layer |= {"attn_q_norm", "attn_k_norm"}
    names = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for i in range(2):
        names |= {f"blk.{i}.{n}.weight" for n in per_layer}
        names |= {f"blk.{i}.{n}.bias" for n in per_layer_bias}
    assert set(arrays) == names
    assert set(types.values()) == {"F32"}

    model = _load_hf(hf_dir)
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    k = model.model.layers[0].self_attn.k_proj.weight.detach().numpy()
    assert arrays["blk.0.attn_q.weight"].shape == q.shape == (64, 64)
    if arch == "llama":  # llama.cpp's rotary layout: rows permuted per head
        np.testing.assert_array_equal(arrays["blk.0.attn_q.weight"], permute_qk(q, 4))
        np.testing.assert_array_equal(arrays["blk.0.attn_k.weight"], permute_qk(k, 2))
        assert not np.array_equal(arrays["blk.0.attn_q.weight"], q)
    else:
        np.testing.assert_array_equal(arrays["blk.0.attn_q.weight"], q)
        np.testing.assert_array_equal(arrays["blk.0.attn_k.weight"], k)


@pytest.mark.parametrize("ftype", ["F16", "Q8_0", "Q4_0"])
def test_gguf_tensor_types(ftype, tiny_gguf_files):
    meta, arrays, types = _read_gguf(tiny_gguf_files["qwen2", ftype])
    assert meta["general.file_type"] == gguf.LlamaFileType[
        {"F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0"}[ftype]
    ]
    for name, array in arrays.items():
        assert types[name] == ("F32" if array.ndim == 1 else ftype), name


FTYPE_CASES = ("F32", "F16", "Q8_0", "Q4_0")


@functools.cache
def _reference_logits(hf_dir: str, ftype: str) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(inputs, logits) of the HF model, its 2-D weights put through `ftype` first unless F32."""
    model = _load_hf(hf_dir)
    if ftype != "F32":
        _roundtrip_weights_(model, ftype)
    sequences = _token_sequences(model.config.vocab_size)
    return sequences, _logits(model, sequences)


def _check_gguf_logits(model, hf_dir, ftype: str) -> None:
    """The GGUF model equals the HF one with the same weight encoding (atol 1e-4), and is close
    to the fp32 original (F16 / Q8_0: `LOOSE_ATOL`; Q4_0: correlation only)."""
    sequences, original = _reference_logits(str(hf_dir), "F32")
    got = _logits(model, sequences)
    _assert_logits_close(got, _reference_logits(str(hf_dir), ftype)[1], atol=1e-4)
    if ftype in LOOSE_ATOL:
        _assert_logits_close(got, original, atol=LOOSE_ATOL[ftype])
    for g, w in zip(got, original, strict=True):
        assert torch.corrcoef(torch.stack([g.flatten(), w.flatten()]))[0, 1] > 0.9


@pytest.mark.parametrize("ftype", FTYPE_CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_logits_match_transformers(arch, ftype, tiny_hf_dirs, tiny_gguf_files):
    """transformers rebuilds config and weights from the GGUF alone (un-permuting llama Q/K,
    dequantizing): logits equal the HF model's."""
    hf_dir, path = tiny_hf_dirs[arch], tiny_gguf_files[arch, ftype]
    gap = _gguf_config_gap(hf_dir, path)
    if gap is not None and arch == "qwen3":
        pytest.skip(
            f"transformers' GGUF config mapping for qwen3 reads no head_dim key (it keeps "
            f"Qwen3Config's default 128): {gap}; see test_qwen3_gguf_logits_with_hf_config"
        )
    assert gap is None, gap
    _check_gguf_logits(load_gguf_model(path), hf_dir, ftype)


@pytest.mark.parametrize("ftype", FTYPE_CASES)
def test_qwen3_gguf_logits_with_hf_config(ftype, tiny_hf_dirs, tiny_gguf_files):
    """qwen3 GGUF weights (incl. q/k norms), loaded by transformers with the HF config."""
    hf_dir = tiny_hf_dirs["qwen3"]
    config = AutoConfig.from_pretrained(str(hf_dir))
    model = load_gguf_model(tiny_gguf_files["qwen3", ftype], config=config)
    _check_gguf_logits(model, hf_dir, ftype)


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_tokenizer_matches_hf(arch, tiny_hf_dirs, tiny_gguf_files):
    path = tiny_gguf_files[arch, "F32"]
    hf_tok = AutoTokenizer.from_pretrained(str(tiny_hf_dirs[arch]))
    gguf_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert len(gguf_tok) == len(hf_tok)
    assert gguf_tok.eos_token == hf_tok.eos_token == "<|im_end|>"
    assert gguf_tok.bos_token is None
    assert gguf_tok.chat_template == hf_tok.chat_template
    for text in TEXTS:
        assert gguf_tok.encode(text) == hf_tok.encode(text), text
    chat = [{"role": "user", "content": "What's 2+2?"}]
    assert gguf_tok.apply_chat_template(chat, add_generation_prompt=True) == (
        hf_tok.apply_chat_template(chat, add_generation_prompt=True)
    )


def test_tied_llama_gguf(tmp_path):
    """Tied embeddings: no output.weight in the file, and transformers ties them back."""
    hf_dir = make_hf_model("llama", tmp_path / "hf", seed=3, tie_word_embeddings=True)
    path = hf_to_gguf(hf_dir, tmp_path / "gguf" / "tied.gguf")
    _, arrays, _ = _read_gguf(path)
    assert "output.weight" not in arrays
    sequences = _token_sequences(AutoConfig.from_pretrained(str(hf_dir)).vocab_size)
    model = load_gguf_model(path)
    assert model.config.tie_word_embeddings
    _assert_logits_close(_logits(model, sequences), _logits(_load_hf(hf_dir), sequences), atol=1e-4)


def test_llama3_rope_scaling_gguf(tmp_path):
    """llama3 rope scaling becomes llama.cpp's rope_freqs.weight; weights still round-trip."""
    hf_dir = make_hf_model("llama", tmp_path / "hf", seed=4, rope_scaling=dict(LLAMA3_ROPE))
    path = hf_to_gguf(hf_dir, tmp_path / "gguf" / "rope.gguf")
    reference = _load_hf(hf_dir)
    assert reference.config.rope_parameters["rope_type"] == "llama3"

    _, arrays, types = _read_gguf(path)
    factors = arrays["rope_freqs.weight"]
    assert types["rope_freqs.weight"] == "F32" and factors.shape == (8,)
    np.testing.assert_allclose(factors, llama3_rope_factors(10000.0, 16, LLAMA3_ROPE))
    # transformers' own llama3 frequencies are the plain ones divided by these factors
    plain = 1.0 / (10000.0 ** (np.arange(0, 16, 2, dtype=np.float32) / 16))
    hf_inv_freq = reference.model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(plain / factors, hf_inv_freq, rtol=1e-5)
    assert len(set(factors.tolist())) > 2  # low, high and smoothed bands all present

    # transformers ignores rope_freqs.weight and rebuilds no rope scaling for llama GGUFs, so
    # compare the weights with the HF config passed explicitly.
    config = AutoConfig.from_pretrained(str(hf_dir))
    sequences = _token_sequences(config.vocab_size)
    sequences.append(list(range(100)) * 2)  # past original_max_position_embeddings
    got = _logits(load_gguf_model(path, config=config), sequences)
    _assert_logits_close(got, _logits(reference, sequences), atol=1e-4)
