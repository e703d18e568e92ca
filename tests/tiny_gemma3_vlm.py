"""A tiny random Gemma 3 vision-language checkpoint, as a release lays it out
(:func:`make_gemma3_vlm_hf`), and its text GGUF as llama.cpp's ``convert_hf_to_gguf.py``
(``Gemma3Model``) writes it (:func:`gemma3_vlm_text_gguf`).

The folder: transformers' own ``Gemma3ForConditionalGeneration`` (float32) saved with
``save_pretrained``; text: 6 layers (Gemma 3's 5:1 pattern, the one llama.cpp hard-codes for
GGUF files, so both mean the same model), hidden 64, heads of 16, window 8, linear rope
scaling x8 on the global layer (as the 4B and up); vision: SigLIP, image 64, patch 4, hidden
32, 2 layers, 2 heads, no pooling head (as the releases), 16 tokens an image. The token table
is drawn 4x narrower than tiny_models.py's and the final norm multiplies by about 4: a tied
random model otherwise repeats the prompt's last token (its own embedding dominates the last
hidden state), and the logits spread (std about 2) as a release's do. The tokenizer is
tests/tiny_models.py's with Gemma's turn and image specials appended (``SPECIALS``: ids 384 on),
``<bos>`` as bos, ``<end_of_turn>`` as eos, Gemma 3's released chat template
(tests/chat_templates/google-gemma-3-4b-it.jinja, in tokenizer_config.json and, for the
processor, chat_template.json) and the processor's ``boi_token`` / ``eoi_token`` /
``image_token``; preprocessor_config.json and processor_config.json as the releases have them
(image 64 x 64, 16 tokens).

The GGUF: the converter drops the vision tower and projector, strips ``language_model.``,
stores the norms as 1 + w, cuts the embedding to the tokenizer's rows, drops the tied head;
matrices take ``ftype`` (F32, F16, Q8_0), 1-D tensors stay F32. The vocabulary is the gpt2 one
(no tokenizer.model), its pre-tokenizer ``qwen2`` (tiny_models.py says why).
benchmarks/check_tiny_gemma3_vlm_converter.py compares the file with the real converter's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_models import (
    _FILE_TYPES,
    GGUF_TOKENIZER_PRE,
    PAD_TOKEN,
    _load_state_dict,
    _randomize_,
    save_tokenizer,
)

BOI, EOI, IMAGE_TOKEN = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
BOS, EOS = "<bos>", "<end_of_turn>"
SPECIALS = (BOS, "<start_of_turn>", EOS, BOI, EOI, IMAGE_TOKEN)
IMAGE_SIZE, TOKENS_PER_IMAGE = 64, 16
CHAT_TEMPLATE = (Path(__file__).parent / "chat_templates" / "google-gemma-3-4b-it.jinja"
                 ).read_text(encoding="utf-8")
_S, _F = "sliding_attention", "full_attention"
TEXT_FIELDS = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "query_pre_attn_scalar": 16, "sliding_window": 8, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "layer_types": [_S] * 5 + [_F],
    "rope_parameters": {_F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                        _S: {"rope_type": "default", "rope_theta": 10_000.0}}}
VISION_FIELDS = {"image_size": IMAGE_SIZE, "patch_size": 4, "hidden_size": 32,
                 "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "vision_use_head": False}
# google/gemma-3-4b-it's files, at this image size and token count
PREPROCESSOR = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": TOKENS_PER_IMAGE, "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor",
    "resample": 2, "rescale_factor": 1 / 255, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}
PROCESSOR = {"image_seq_length": TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"}


def make_gemma3_vlm_hf(path: str | Path, seed: int = 0, **text_overrides) -> Path:
    """Build the tiny random Gemma 3 VLM (module docstring) and save it to ``path``;
    ``text_overrides``: Gemma3TextConfig fields. Returns ``path``."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        GenerationConfig,
        SiglipVisionConfig,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(
        path, SPECIALS, bos_token=BOS, eos_token=EOS, chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE_TOKEN})
    bos, eos, pad, boi, eoi, image = tokenizer.convert_tokens_to_ids(
        [BOS, EOS, PAD_TOKEN, BOI, EOI, IMAGE_TOKEN])
    text = Gemma3TextConfig(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos,
                            pad_token_id=pad, **{**TEXT_FIELDS, **text_overrides})
    config = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**VISION_FIELDS),
                          mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=boi,
                          eoi_token_index=eoi, image_token_index=image)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32)
    # Gemma's RMSNorms (text, projector) multiply by 1 + w: mean 0; SigLIP's LayerNorms by w
    _randomize_(model.model.language_model, seed, norm_mean=0.0)
    _randomize_(model.model.multi_modal_projector, seed + 1, norm_mean=0.0)
    _randomize_(model.model.vision_tower, seed + 2, norm_mean=1.0)
    text_model = model.model.language_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        text_model.embed_tokens.weight.mul_(0.25)
        text_model.norm.weight.add_(3.0)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos,
                                               pad_token_id=pad)
    model.save_pretrained(str(path))
    for name, data in (("preprocessor_config.json", PREPROCESSOR),
                       ("processor_config.json", PROCESSOR),
                       ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


# -- the text GGUF ---------------------------------------------------------------------------

def _text_name(name: str) -> str | None:
    """The converter's text-model name of a checkpoint tensor (``TextModel.filter_tensors``:
    vision and projector tensors dropped, ``language_model.`` stripped; the tied head
    dropped), None when it writes nothing for it."""
    bare = name.removeprefix("model.")
    if bare.startswith(("vision_tower.", "multi_modal_projector.")):
        return None
    name = name.replace("language_model.", "")
    return None if name == "lm_head.weight" else name


def _qtype(gguf_name: str, w: np.ndarray, ftype: str) -> str:
    if w.ndim <= 1 or gguf_name.endswith("_norm.weight") or ftype == "F32":
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"  # gguf.QuantError: the converter falls back
    return ftype


def _add_tensor(writer, name: str, w: np.ndarray, qtype: str) -> None:
    import gguf

    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == "F32":
        writer.add_tensor(name, w)
    elif qtype == "F16":
        writer.add_tensor(name, w.astype(np.float16))
    else:
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)


def _add_hparams(writer, text: dict, ftype: str) -> None:
    """The keys TextModel and Gemma3Model write (final values)."""
    import gguf

    full = text["rope_parameters"][_F]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(text["num_hidden_layers"])
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    writer.add_rope_freq_base(full["rope_theta"])
    writer.add_rope_freq_base_swa(text["rope_parameters"][_S]["rope_theta"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    if text.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(text["final_logit_softcapping"])
    writer.add_sliding_window(text["sliding_window"])


def _add_vocab(writer, hf_dir: Path, vocab_size: int) -> None:
    """``tokenizer.ggml.*`` as the converter's ``_set_vocab_gpt2`` writes them: every id up
    to the config's vocabulary (added specials CONTROL, other added tokens USER_DEFINED), the
    merges, special ids, flags and chat template by gguf's own ``SpecialVocab``."""
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, kinds = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            kinds.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(added[i].content)
            kinds.append(gguf.TokenType.CONTROL if added[i].special
                         else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            kinds.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_TOKENIZER_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types([int(k) for k in kinds])
    special = gguf.SpecialVocab(hf_dir, load_merges=True)
    for kind in ("bos", "eos"):  # the converter's gguf-py reads a ByteLevel post-processor so
        special.add_special_token.setdefault(kind, False)
    special.add_to_gguf(writer)


def gemma3_vlm_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``gemma3`` GGUF of the text model of a :func:`make_gemma3_vlm_hf` folder, as the
    converter writes it (module docstring); ``ftype`` F32, F16 or Q8_0. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    folder, out_path = Path(folder), Path(out_path)
    text = json.loads((folder / "config.json").read_text(encoding="utf-8"))["text_config"]
    tok_json = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    num_rows = len(tok_json["model"]["vocab"]) + len(tok_json["added_tokens"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, text["num_hidden_layers"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "gemma3")
    _add_hparams(writer, text, ftype)
    _add_vocab(writer, folder, text["vocab_size"])
    for name, w in _load_state_dict(folder).items():
        if (hf_name := _text_name(name)) is None:
            continue
        if hf_name.endswith("embed_tokens.weight"):
            w = w[:num_rows]  # the converter's cut to the tokenizer's rows
        elif hf_name.endswith("norm.weight"):
            w = w + 1.0
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for tensor {name!r}")
        _add_tensor(writer, gguf_name, w, _qtype(gguf_name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
