"""A tiny random Qwen2.5-VL checkpoint as a release lays it out (:func:`make_qwen25_vl_hf`), its
text GGUF (:func:`qwen25_vl_text_gguf`) and its mmproj GGUF (:func:`qwen25_vl_mmproj_gguf`) as
llama.cpp's ``convert_hf_to_gguf.py`` writes them.

The folder: transformers' own ``Qwen2_5_VLForConditionalGeneration`` (float32, random), saved
the way the Qwen2.5-VL releases are: a flat config.json (the text model's fields at the top,
``rope_scaling`` ``{"type": "mrope", "mrope_section": [2, 3, 3]}``, ``vision_config`` with
``in_chans``) and the tensors ``visual.*``, ``model.*``, ``lm_head.weight``. With
``layout="transformers"`` it is transformers 5's ``save_pretrained`` instead (nested
``text_config`` / ``vision_config``, ``model.visual.*``, ``model.language_model.*``).
Vision: the releases' patch 14, temporal 2, merge 2 and window 112 px (4 x 4 merged tokens: a
300 x 200 picture, 7 x 11 tokens, has 2 x 3 windows, the last row and column cut short;
llama.cpp's mmproj has no window key and runs 112), hidden 32, 2 heads, depth 4, full attention in blocks 1 and 3;
text: Qwen2, 2 layers, hidden 64, 4 heads of 16 (2 KV), mRoPE sections [2, 3, 3].
The token table is drawn 4x narrower than tiny_models.py's and the final norm multiplies by
about 4 (as tests/tiny_smolvlm.py does) so that greedy answers follow the picture.
The tokenizer is tests/tiny_models.py's (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``)
with Qwen's vision specials appended (``SPECIALS``, ids 384 on); the release's chat template
(Qwen/Qwen2.5-VL-3B-Instruct) in tokenizer_config.json and chat_template.json;
preprocessor_config.json as the release has it at the tiny sizes (``MIN_PIXELS`` /
``MAX_PIXELS``: 4 to 256 tokens).

The text GGUF (``Qwen2VLModel``, arch ``qwen2vl``): the Qwen2 text model as tiny_models.py's
``hf_to_gguf`` writes a ``qwen2`` one, plus ``qwen2vl.rope.dimension_sections`` [2, 3, 3, 0].
The mmproj GGUF (``Qwen2VLVisionModel``, projector ``qwen2.5vl_merger``): the Conv3d split into
two 2-D kernels (``v.patch_embd.weight`` / ``.weight.1``), qkv split into q, k, v, gguf-py's
MMPROJ names; 1-D tensors F32, the patch kernels ``ftype`` in an f16 / f32 file and F32
otherwise, the other matrices ``ftype``. benchmarks/check_tiny_qwen25_vl_converter.py compares both with the real converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_models import (
    _FILE_TYPES,
    PAD_TOKEN,
    _add_tensor,
    _add_tokenizer,
    _gguf_tensors,
    _load_state_dict,
    _randomize_,
    save_tokenizer,
)

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
SPECIALS = (VISION_START, VISION_END, "<|vision_pad|>", IMAGE_PAD, "<|video_pad|>")
EOS = "<|im_end|>"
PATCH, MERGE, TEMPORAL, WINDOW = 14, 2, 2, 112
MIN_PIXELS, MAX_PIXELS = 4 * (PATCH * MERGE) ** 2, 256 * (PATCH * MERGE) ** 2
MROPE_SECTION = [2, 3, 3]
# Qwen/Qwen2.5-VL-3B-Instruct's chat_template.json
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT_FIELDS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
               "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "sliding_window": 512,
               "max_window_layers": 2, "use_sliding_window": False, "hidden_act": "silu"}
VISION_FIELDS = {"depth": 4, "hidden_size": 32, "hidden_act": "silu", "intermediate_size": 64,
                 "num_heads": 2, "out_hidden_size": 64, "patch_size": PATCH,
                 "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL,
                 "window_size": WINDOW, "fullatt_block_indexes": [1, 3],
                 "tokens_per_second": 2}
# Qwen/Qwen2.5-VL-3B-Instruct's preprocessor_config.json at the tiny sizes
PREPROCESSOR = {
    "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}


def make_qwen25_vl_hf(path: str | Path, seed: int = 0, layout: str = "release",
                      tie_word_embeddings: bool = False) -> Path:
    """Build the tiny random Qwen2.5-VL (module docstring) and save it to ``path`` in
    ``layout`` "release" or "transformers"; returns ``path``."""
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    if layout not in ("release", "transformers"):
        raise ValueError(f"layout {layout!r} not in ('release', 'transformers')")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, eos_token=EOS, chat_template=CHAT_TEMPLATE)
    ids = dict(zip(SPECIALS, tokenizer.convert_tokens_to_ids(list(SPECIALS))))
    eos, pad = tokenizer.convert_tokens_to_ids([EOS, PAD_TOKEN])
    top = {"vision_start_token_id": ids[VISION_START], "vision_end_token_id": ids[VISION_END],
           "vision_token_id": ids["<|vision_pad|>"], "image_token_id": ids[IMAGE_PAD],
           "video_token_id": ids["<|video_pad|>"], "tie_word_embeddings": tie_word_embeddings}
    text = {**TEXT_FIELDS, "vocab_size": len(tokenizer), "bos_token_id": pad,
            "eos_token_id": eos, "rope_scaling": {"type": "mrope",
                                                  "mrope_section": list(MROPE_SECTION)},
            "tie_word_embeddings": tie_word_embeddings}
    config = Qwen2_5_VLConfig(text_config=dict(text), vision_config=dict(VISION_FIELDS), **top)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    _randomize_(model, seed, norm_mean=1.0)
    language = model.model.language_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        language.embed_tokens.weight.mul_(0.25)
        language.norm.weight.mul_(4.0)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos,
                                               pad_token_id=pad)
    if layout == "transformers":
        model.save_pretrained(str(path))
    else:
        _save_release(model, path, {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                                    "model_type": "qwen2_5_vl", **text, **top,
                                    "vision_config": {**VISION_FIELDS, "in_chans": 3}})
    for name, data in (("preprocessor_config.json", PREPROCESSOR),
                       ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _release_name(name: str) -> str:
    """transformers 5's tensor name → the releases' (``visual.*``, ``model.*``, ``lm_head``)."""
    if name.startswith("model.visual."):
        return name.removeprefix("model.")
    return name.replace("model.language_model.", "model.", 1)


def _save_release(model, path: Path, config: dict) -> None:
    from safetensors.torch import save_file

    state = {_release_name(k): v.detach().contiguous() for k, v in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {**config, "torch_dtype": "float32", "transformers_version": "4.49.0"}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    model.generation_config.save_pretrained(str(path))


# -- the text GGUF ---------------------------------------------------------------------------

def qwen25_vl_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``qwen2vl`` GGUF of a release-layout :func:`make_qwen25_vl_hf` folder's text model,
    as the converter writes it (module docstring); ``ftype`` F32, F16 or Q8_0."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = {k: v for k, v in config.items() if k not in ("vision_config", "rope_scaling")}
    state = {k: w for k, w in _load_state_dict(folder).items() if not k.startswith("visual.")}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "qwen2vl")
    writer.add_type(gguf.GGUFType.MODEL)
    _add_text_hparams(writer, config, ftype)
    _add_tokenizer(writer, folder, text["vocab_size"])
    writer.add_bos_token_id(config["bos_token_id"])  # the converter takes it from config.json
    for name, w in _gguf_tensors("qwen2", text, state).items():
        _add_tensor(writer, name, w, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _add_text_hparams(writer, config: dict, ftype: str) -> None:
    """The keys ``Qwen2VLModel`` writes (no head sizes, no vocab size: llama.cpp derives
    them), with the mRoPE sections padded to four."""
    import gguf

    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    sections = list(config["rope_scaling"]["mrope_section"])
    writer.add_rope_dimension_sections((sections + [0] * 4)[:4])


# -- the mmproj GGUF -------------------------------------------------------------------------

_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def _mmproj_tensors(names, state: dict[str, np.ndarray]):
    """(gguf name, hf name, array) of the vision tensors, split as ``Qwen2VLVisionModel``
    splits them."""
    for name, w in state.items():
        if not name.startswith("visual."):
            continue
        if name.endswith("patch_embed.proj.weight"):  # [out, C, T, P, P] → two [out, C, P, P]
            yield "v.patch_embd.weight", name, w[:, :, 0]
            yield "v.patch_embd.weight.1", name, w[:, :, 1]
        elif ".qkv." in name:
            for part, rows in zip("qkv", np.split(w, 3, axis=0)):
                split_name = name.replace("qkv", part)
                yield _gguf_name(names, split_name), split_name, rows
        else:
            yield _gguf_name(names, name), name, w


def _gguf_name(names, name: str) -> str:
    gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
    if gguf_name is None:
        raise KeyError(f"no mmproj name for tensor {name!r}")
    return gguf_name


def _mmproj_qtype(gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type: 1-D F32; the patch kernels (4-D) F16 in an f16 file, else F32; a
    Q8_0 row that does not split into blocks F16."""
    if w.ndim <= 1 or (w.ndim > 2 and ftype not in ("F32", "F16")):
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"
    return ftype


def _add_mmproj_hparams(writer, config: dict, preprocessor: dict, ftype: str) -> None:
    """The keys MmprojModel and Qwen2VLVisionModel write."""
    import gguf

    v = config["vision_config"]
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(config["hidden_size"])
    writer.add_vision_image_size(v.get("image_size", 560))
    writer.add_vision_patch_size(v["patch_size"])
    writer.add_vision_embedding_length(v["hidden_size"])
    writer.add_vision_feed_forward_length(v["intermediate_size"])
    writer.add_vision_block_count(v["depth"])
    writer.add_vision_head_count(v["num_heads"])
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
    writer.add_vision_use_silu(True)
    full = v["fullatt_block_indexes"]
    writer.add_vision_n_wa_pattern(full[0] + 1)
    writer.add_vision_attention_layernorm_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def qwen25_vl_mmproj_gguf(folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The ``qwen2.5vl_merger`` mmproj GGUF of a release-layout :func:`make_qwen25_vl_hf`
    folder, as ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it (module docstring);
    ``ftype`` f32, f16, bf16 or q8_0."""
    import gguf

    if ftype.lower() not in _FTYPES:
        raise ValueError(f"ftype {ftype!r} not in {sorted(_FTYPES)}")
    ftype = _FTYPES[ftype.lower()]
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, config["vision_config"]["depth"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "clip")
    _add_mmproj_hparams(writer, config, preprocessor, ftype)
    for gguf_name, _, w in _mmproj_tensors(names, _load_state_dict(folder)):
        kind = gguf.GGMLQuantizationType[_mmproj_qtype(gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
