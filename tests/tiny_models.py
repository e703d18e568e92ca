"""Tiny random-weight models, as Hugging Face folders and as GGUF files, for logit-parity tests.

Two entry points:

* :func:`make_hf_model` builds a 2-layer llama / qwen2 / qwen3 model with random (but not
  degenerate) fp32 weights and writes it, with a tiny byte-level BPE tokenizer, as a Hugging Face
  folder (``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
  ``tokenizer_config.json`` with a ChatML ``chat_template``).
* :func:`hf_to_gguf` converts such a folder to a GGUF file the way llama.cpp's
  ``convert_hf_to_gguf.py`` would (same metadata keys, tensor names, llama Q/K permutation), at
  F32, F16, Q8_0, Q4_0 or a Q4_K_M-like mix of K-quants.

The tokenizer splits text with Qwen2's pre-tokenizer regex followed by a byte-level mapping (no
normalizer), which is exactly llama.cpp's ``qwen2`` pre-tokenizer. The GGUF therefore always says
``tokenizer.ggml.pre = "qwen2"``, whatever the architecture: the pre-tokenizer belongs to the
vocabulary, not to the model.
"""

from __future__ import annotations

import json
import math
import random
from functools import cache
from pathlib import Path

import numpy as np
import torch

ARCHS = ("llama", "qwen2", "qwen3")
EXTRA_ARCHS = ("phi3",)  # built on demand only (not in the session fixtures)
# Models with sliding-window layers, built on demand (not in the session's `tiny_hf_dirs`):
# Mistral (every layer windowed; GGUF arch "llama"), Gemma 2 and Gemma 3 (text).
WINDOWED_ARCHS = ("mistral", "gemma2", "gemma3")
_GGUF_ARCH = {"mistral": "llama"}  # model_type -> GGUF general.architecture
FTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# ChatML, as in Qwen2.5 / SmolLM2 (without their default system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2's split regex; llama.cpp's `qwen2` pre-tokenizer uses the same one.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_TOKENIZER_PRE = "qwen2"

# BPE vocabulary before the special tokens are appended; 381 + 3 specials = 384 tokens.
_BPE_VOCAB_SIZE = 381

# Weight scales: large enough that attention is far from uniform and logits spread out.
_EMBED_STD = 0.25
_LINEAR_STD = 0.1
_BIAS_STD = 0.1
_NORM_STD = 0.1  # norm weights are drawn from N(1, 0.1), never all ones

_HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # phi3: stored fused
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # phi3: gate and up stacked in ffn_up
}
_HF_TO_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

_WORDS = (
    "the a an and or but if then when while of to in on at for with from by as is are was were be "
    "been have has had do does did can could will would should may might must not no yes this that "
    "these those it its he she they we you i me him her them us my your our their what which who "
    "how why where time day year people way thing man woman child world life hand part place case "
    "week work system program question number night point home water room mother area money story "
    "fact month lot right study book eye job word business issue side kind head house service "
    "friend father power hour game line end member law car city name team minute idea kid body "
    "information back parent face others level office door health person art war history party "
    "result change morning reason research girl guy moment air teacher force education model token "
    "server engine cache request batch prefix tree radix memory kernel tensor layer weight small "
    "large quick brown fox jumps over lazy dog good new first last long great little own other old "
    "big high different local early young important few public bad same able run make go know take "
    "see come think look want give use find tell ask seem feel try leave call keep let begin help"
).split()
_CONTRACTIONS = ("don't", "it's", "we're", "they've", "I'm", "you'll", "she'd", "can't", "won't")
_PUNCT = (".", ".", ".", "!", "?", ",", ";", ":", " -", "...")


def _corpus(n_lines: int = 400, seed: int = 1234) -> list[str]:
    """Generated English-ish lines: words, contractions, digits, punctuation, indentation."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(4, 14)):
            roll = rng.random()
            if roll < 0.06:
                words.append(rng.choice(_CONTRACTIONS))
            elif roll < 0.12:
                words.append(str(rng.randint(0, 2025)))
            else:
                word = rng.choice(_WORDS)
                words.append(word.capitalize() if rng.random() < 0.1 else word)
        line = " ".join(words)
        line = line[0].upper() + line[1:] + rng.choice(_PUNCT)
        if rng.random() < 0.1:
            line = "    " + line
        lines.append(line)
    return lines


def _train_tokenizer():
    """Train the byte-level BPE (a `tokenizers.Tokenizer`), specials appended at the end."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tokenizer


@cache
def _tokenizer_json() -> str:
    """The trained tokenizer, serialized; trained once per process."""
    return _train_tokenizer().to_str()


def make_tokenizer(extra_specials: tuple[str, ...] = (), **overrides):
    """A fresh `PreTrainedTokenizerFast` for the tiny tokenizer (ChatML template, eos im_end).

    `extra_specials`: more special tokens, appended after the tiny ones (ids 384 on, in order);
    `overrides`: `PreTrainedTokenizerFast` arguments replacing the defaults (e.g. `bos_token`,
    `eos_token`, `chat_template`, `extra_special_tokens`)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_str(_tokenizer_json())
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in extra_specials])
    kwargs = {"bos_token": None, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN,
              "unk_token": None, "chat_template": CHATML_TEMPLATE, "model_max_length": 512,
              "clean_up_tokenization_spaces": False}
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{**kwargs, **overrides})


def save_tokenizer(out_dir: str | Path, extra_specials: tuple[str, ...] = (), **overrides):
    """Write tokenizer.json and tokenizer_config.json (with the chat template in it);
    `extra_specials` and `overrides` as for `make_tokenizer`."""
    tokenizer = make_tokenizer(extra_specials, **overrides)
    # The chat template goes into tokenizer_config.json (the classic layout most hub repos have),
    # not into a separate chat_template.jinja.
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
    return tokenizer


# --------------------------------------------------------------------------------------------
# Hugging Face model
# --------------------------------------------------------------------------------------------


def _config_class(arch: str):
    from transformers import (Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig,
                              Phi3Config, Qwen2Config, Qwen3Config)

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
               "phi3": Phi3Config, "mistral": MistralConfig, "gemma2": Gemma2Config,
               "gemma3": Gemma3TextConfig}
    if arch not in classes:
        raise ValueError(f"unknown arch {arch!r}; expected one of "
                         f"{ARCHS + EXTRA_ARCHS + WINDOWED_ARCHS}")
    return classes[arch]


# The windowed models' defaults: a window of 8 tokens (block sizes 4-16 cross it inside a
# block and at its edge); Gemma's query scale as llama.cpp computes it for GGUF files
# (head_dim ** -0.5), so the GGUF file means the same model; Gemma 3 with six layers, so
# its 5:1 pattern has a global layer.
_WINDOWED_DEFAULTS = {
    "mistral": dict(sliding_window=8),
    "gemma2": dict(sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, tie_word_embeddings=True),
    "gemma3": dict(sliding_window=8, query_pre_attn_scalar=16, num_hidden_layers=6,
                   rope_theta=100000.0, rope_local_base_freq=10000.0, tie_word_embeddings=True),
}


def make_config(arch: str, vocab_size: int, eos_id: int, pad_id: int, **overrides):
    """The tiny config for `arch`; `overrides` replace any default (e.g. `rope_scaling`)."""
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    if arch == "phi3":  # head_dim is hidden / heads; the original length is top-level
        del kwargs["head_dim"]
        kwargs["original_max_position_embeddings"] = kwargs["max_position_embeddings"]
    kwargs.update(_WINDOWED_DEFAULTS.get(arch, {}))
    kwargs.update(overrides)
    return _config_class(arch)(**kwargs)


def _randomize_(model: torch.nn.Module, seed: int, norm_mean: float = 1.0) -> None:
    """Redraw every parameter: linears/embeddings N(0, s), biases N(0, s), norms
    N(norm_mean, s) (Gemma's norms multiply by 1 + w: mean 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights are listed once
            if "norm" in name:
                values = norm_mean + _NORM_STD * torch.randn(param.shape, generator=gen)
            elif name.endswith("bias"):
                values = _BIAS_STD * torch.randn(param.shape, generator=gen)
            elif "embed_tokens" in name:
                values = _EMBED_STD * torch.randn(param.shape, generator=gen)
            else:
                values = _LINEAR_STD * torch.randn(param.shape, generator=gen)
            param.copy_(values)


def make_hf_model(arch: str, out_dir: str | Path, seed: int = 0,
                  save_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """Build a tiny random `arch` model and save it, with the tiny tokenizer, to `out_dir`.

    `overrides` are config fields, e.g. ``tie_word_embeddings=True`` or, for llama,
    ``rope_scaling={"rope_type": "llama3", "factor": 8.0, ...}``; `save_dtype` the weights'
    stored type (float16 / bfloat16: the random float32 weights rounded). Returns `out_dir`.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = make_config(arch, len(tokenizer), eos_id, pad_id, **overrides)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed, norm_mean=0.0 if arch.startswith("gemma") else 1.0)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id
    )
    model.to(save_dtype).save_pretrained(str(out_dir))  # safetensors (the only/default format)
    return out_dir


# --------------------------------------------------------------------------------------------
# GGUF conversion
# --------------------------------------------------------------------------------------------


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _load_state_dict(hf_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of the folder's safetensors files, as fp32 numpy arrays."""
    from safetensors import safe_open

    state = {}
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {hf_dir}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key).float().numpy()
    return state


def _rope(config: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope scaling dict or None), from a v4 (`rope_theta`/`rope_scaling`) or v5
    (`rope_parameters`) config.json."""
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling") or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), (None if rope_type == "default" else dict(scaling, rope_type=rope_type))


def llama3_rope_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """llama.cpp's `rope_freqs.weight` for llama3 rope scaling: per-frequency divisors.

    Same formula as convert_hf_to_gguf.py, except that `original_max_position_embeddings` is
    read from the rope scaling dict (where transformers reads it), not from the top-level config
    (llama.cpp's converter falls back to 8192 there, which only matters for configs like ours).
    """
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = scaling.get("factor", 8.0)
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K permutation (HF rotate-half layout -> GGUF interleaved layout)."""
    head_half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, head_half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Gemma's four norms per layer, as llama.cpp names them (its `ffn_norm` is the pre-MLP norm)
_GEMMA_TO_GGUF_LAYER = dict(_HF_TO_GGUF_LAYER, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
})


def gguf_tensor_name(hf_name: str, gemma: bool = False) -> str:
    """The llama.cpp name of an HF tensor, e.g. `model.layers.3.mlp.up_proj.weight` ->
    `blk.3.ffn_up.weight`."""
    if hf_name in _HF_TO_GGUF_GLOBAL:
        return _HF_TO_GGUF_GLOBAL[hf_name]
    layer_names = _GEMMA_TO_GGUF_LAYER if gemma else _HF_TO_GGUF_LAYER
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in layer_names:
        return f"blk.{parts[2]}.{layer_names[parts[3]]}"
    raise KeyError(f"no GGUF name for tensor {hf_name!r}")


def _gguf_tensors(arch: str, config: dict, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF name -> fp32 array, llama Q/K permuted, tied output dropped, rope_freqs added."""
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    tied = config.get("tie_word_embeddings", False)
    gemma = arch.startswith("gemma")
    tensors = {}
    for hf_name, w in state.items():
        if hf_name == "lm_head.weight" and tied:
            continue
        if arch in ("llama", "mistral") and ".self_attn.q_proj." in hf_name:
            w = permute_qk(w, n_head)
        elif arch in ("llama", "mistral") and ".self_attn.k_proj." in hf_name:
            w = permute_qk(w, n_kv)
        elif gemma and hf_name.endswith("norm.weight"):
            w = w + 1.0  # llama.cpp's converter stores Gemma's norms as the multiplier 1 + w
        tensors[gguf_tensor_name(hf_name, gemma)] = w
    theta, scaling = _rope(config)
    if scaling is not None and arch == "phi3" and scaling["rope_type"] == "longrope":
        # convert_hf_to_gguf.py's Phi3MiniModel: the two factor sets as tensors
        tensors["rope_factors_long.weight"] = np.asarray(scaling["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.asarray(scaling["short_factor"], np.float32)
    elif scaling is not None and scaling["rope_type"] in ("linear", "yarn"):
        pass  # written as rope.scaling.* keys (_add_hparams)
    elif scaling is not None:
        if scaling["rope_type"] != "llama3" or arch != "llama":
            raise NotImplementedError(f"rope scaling {scaling['rope_type']!r} for {arch}")
        tensors["rope_freqs.weight"] = llama3_rope_factors(theta, _head_dim(config), scaling)
    return dict(sorted(tensors.items(), key=lambda kv: _tensor_order(kv[0])))


def _tensor_order(name: str) -> tuple:
    """llama.cpp-like order: token_embd, rope_freqs, blk.0 ... blk.N, output_norm, output."""
    if name.startswith("blk."):
        return (2, int(name.split(".")[1]), name)
    rank = {"token_embd.weight": 0, "rope_freqs.weight": 1, "rope_factors_long.weight": 1,
            "rope_factors_short.weight": 1, "output_norm.weight": 3}
    return (rank.get(name, 4), 0, name)


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _q4_k_m_type(name: str, cols: int) -> str:
    """llama.cpp's Q4_K_M mix, simplified: Q6_K for attn_v, ffn_down and the output head,
    Q4_K elsewhere; matrices whose rows are not a multiple of 256 fall back to Q5_0 / Q8_0
    (as llama.cpp falls back), so a fused layer can mix K and legacy types."""
    kind = "Q6_K" if any(k in name for k in ("attn_v", "ffn_down", "output.")) else "Q4_K"
    if cols % 256:
        kind = "Q8_0" if kind == "Q6_K" else "Q5_0"
    return kind


def _add_tensor(writer, name: str, w: np.ndarray, ftype: str) -> None:
    """Add one tensor: 1-D tensors stay F32, 2-D ones are converted to `ftype`."""
    import gguf
    from kquants import quantize

    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or ftype == "F32":
        writer.add_tensor(name, w)
    elif ftype == "F16":
        writer.add_tensor(name, w.astype(np.float16))
    else:
        kind = _q4_k_m_type(name, w.shape[-1]) if ftype == "Q4_K_M" else ftype
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, quantize(w, qtype), raw_dtype=qtype)


def _special_token(tok_config: dict, key: str) -> str | None:
    value = tok_config.get(key)
    return value.get("content") if isinstance(value, dict) else value


def _uses_qwen2_split(tok_json: dict) -> bool:
    """Whether tokenizer.json splits with Qwen2's regex (so llama.cpp's `qwen2` pre applies)."""
    pre = tok_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    return any(s.get("pattern", {}).get("Regex") == QWEN2_SPLIT_REGEX for s in steps)


def _add_tokenizer(writer, hf_dir: Path, vocab_size: int) -> None:
    """tokenizer.ggml.* keys from tokenizer.json / tokenizer_config.json, as llama.cpp's `gpt2`."""
    import gguf

    tok_json = _load_json(hf_dir / "tokenizer.json")
    tok_config = _load_json(hf_dir / "tokenizer_config.json")
    if not _uses_qwen2_split(tok_json):
        raise NotImplementedError("only the tiny Qwen2-style byte-level tokenizer is supported")

    by_id: dict[int, tuple[str, int]] = {
        i: (tok, gguf.TokenType.NORMAL) for tok, i in tok_json["model"]["vocab"].items()
    }
    for added in tok_json["added_tokens"]:
        kind = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    # Like llama.cpp, ids the tokenizer does not fill (config vocab > tokenizer) become [PADi].
    entries = [by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED)) for i in range(vocab_size)]
    token_to_id = {tok: i for i, (tok, _) in enumerate(entries)}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_TOKENIZER_PRE)
    writer.add_token_list([tok for tok, _ in entries])
    writer.add_token_types([int(kind) for _, kind in entries])
    writer.add_token_merges(merges)
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        token = _special_token(tok_config, key)
        if token is not None:  # bos is None for the tiny tokenizer, so no bos id is written
            add(token_to_id[token])
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(tok_config.get("add_eos_token", False)))
    chat_template = tok_config.get("chat_template")
    if chat_template is None and (hf_dir / "chat_template.jinja").exists():
        chat_template = (hf_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def _add_hparams(writer, arch: str, config: dict, ftype: str) -> None:
    """general.* and {arch}.* keys, as convert_hf_to_gguf.py writes them."""
    import gguf

    head_dim = _head_dim(config)
    theta, _ = _rope(config)
    if arch == "gemma3":  # the global layers' base (the sliding ones' is llama.cpp's 10000)
        theta = config["rope_parameters"]["full_attention"]["rope_theta"]
    writer.add_name(f"tiny-{arch}")
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if arch == "phi3":
        _add_phi3_hparams(writer, config)
    else:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    if config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if arch == "gemma2" and config.get(key) is not None:
            getattr(writer, f"add_{key}")(config[key])
    # llama3 rope scaling travels as the rope_freqs.weight tensor (no rope.scaling.* keys), as
    # in llama.cpp; linear scaling is written as keys.
    _, scaling = _rope(config)
    if scaling is not None and scaling["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    elif scaling is not None and scaling["rope_type"] == "yarn":  # as convert_hf_to_gguf.py
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        if scaling.get("beta_fast") is not None:
            writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        if scaling.get("beta_slow") is not None:
            writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])


def _add_phi3_hparams(writer, config: dict) -> None:
    """The keys convert_hf_to_gguf.py's Phi3MiniModel adds: rotary dims from
    partial_rotary_factor, original context, sliding window (0: none), longrope's attention
    factor."""
    params = config.get("rope_parameters") or {}
    partial = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    n_embd, n_head = config["hidden_size"], config["num_attention_heads"]
    original = config["original_max_position_embeddings"]
    writer.add_rope_dimension_count(int(partial * n_embd) // n_head)
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_sliding_window(config.get("sliding_window") or 0)
    _, scaling = _rope(config)
    if scaling is not None:
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)


_FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0",
               "Q4_0": "MOSTLY_Q4_0", "Q4_K_M": "MOSTLY_Q4_K_M"}


def hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder written by :func:`make_hf_model` into a llama.cpp-style GGUF file.

    `ftype` is one of F32, F16, BF16, Q8_0, Q4_0, Q4_K_M (a mix, `_q4_k_m_type`); it applies to 2-D
    weights, while norms, biases and
    rope_freqs stay F32. Returns `out_path`.
    """
    import gguf

    if ftype not in _FILE_TYPES:
        raise ValueError(f"ftype {ftype!r} not in {tuple(_FILE_TYPES)}")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = _load_json(hf_dir / "config.json")
    arch = {"gemma3_text": "gemma3"}.get(config["model_type"], config["model_type"])
    if arch not in ARCHS + EXTRA_ARCHS + WINDOWED_ARCHS:
        raise ValueError(f"model_type {arch!r} not in {ARCHS + EXTRA_ARCHS + WINDOWED_ARCHS}")
    tensors = _gguf_tensors(arch, config, _load_state_dict(hf_dir))

    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), _GGUF_ARCH.get(arch, arch))
    _add_hparams(writer, arch, config, ftype)
    _add_tokenizer(writer, hf_dir, config["vocab_size"])
    for name, w in tensors.items():
        _add_tensor(writer, name, w, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


# --------------------------------------------------------------------------------------------
# Loading back with transformers
# --------------------------------------------------------------------------------------------


def load_gguf_model(gguf_path: str | Path, config=None):
    """`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)` in fp32 eval mode.

    transformers refuses GGUF files when `accelerate` is not installed, although its CPU GGUF
    loader never uses it; without accelerate that one check is patched out for the call.
    Pass `config` to use it instead of the config transformers rebuilds from the GGUF metadata.
    """
    import importlib.util
    from contextlib import nullcontext
    from unittest import mock

    import transformers.modeling_utils as modeling_utils
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    gate = (
        nullcontext()
        if importlib.util.find_spec("accelerate") is not None
        else mock.patch.object(modeling_utils, "is_accelerate_available", lambda: True)
    )
    kwargs = {} if config is None else {"config": config}
    with gate:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32, **kwargs
        )
    return model.eval()
