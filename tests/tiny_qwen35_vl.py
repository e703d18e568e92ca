"""A tiny random Qwen3.5 vision-language checkpoint as a release lays it out
(:func:`make_qwen35_vl_hf`) and its mmproj GGUF as llama.cpp's ``convert_hf_to_gguf.py
--mmproj`` writes it (:func:`qwen35_vl_mmproj_gguf`); the text GGUF is tests/tiny_hybrid.py's
``qwen35_hf_to_gguf`` of the same folder (benchmarks/check_tiny_qwen35_vl_converter.py checks
both against the real converter).

The folder: tests/tiny_hybrid.py's ``Qwen3_5ForConditionalGeneration`` (the same hybrid text
model: 4 layers, hidden 64; here with rope over half of each 16-wide head and interleaved mRoPE
sections ``[2, 1, 1]``, so an image row's time, height and width each turn some frequencies,
and a context of ``CONTEXT``) with a coherent tiny vision tower (``VISION``: 2 blocks, hidden 32, 2 heads, patches of 4 px x 2
frames, 2 x 2 merge, an 8 x 8 learned position table resampled to each image's grid, out 64),
saved by ``save_pretrained`` (``model.visual.*``, ``model.language_model.*``, ``lm_head``) as
the releases store it. The token table is drawn 4x narrower and the final norm multiplies by
about 4 (as tests/tiny_smolvlm.py does): greedy answers vary with the picture. The tokenizer is
tests/tiny_models.py's (``<|im_start|>``, ``<|im_end|>`` eos) with Qwen's vision specials
appended (``SPECIALS``: ids 384 on; config.json's ``image_token_id`` and friends name them),
the release's chat template (tests/chat_templates/Qwen3.5-4B.jinja, which takes image parts) in
tokenizer_config.json and chat_template.json, preprocessor_config.json as the release's at tiny
sizes (``PREPROCESSOR``: patch 4, merge 2, mean / std 0.5, 256 to 4096 pixels: 4 to 64 tokens).

The mmproj (conversion/qwen3vl.py ``Qwen3VLVisionModel``, projector ``qwen3vl_merger``): the
``model.visual.`` tensors under gguf-py's MMPROJ names in the folder's order, the Conv3d kernel
cut into its two frames (``v.patch_embd.weight``, ``.weight.1``: F16 for an f16 file, else
F32), the position table and 1-D tensors F32, the other matrices ``ftype``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_hybrid import QWEN35_TEXT_DEFAULTS, make_qwen35_hf_model
from tiny_models import _FILE_TYPES, _load_state_dict, _randomize_, make_tokenizer, save_tokenizer

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
SPECIALS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
PATCH, MERGE, TEMPORAL = 4, 2, 2
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
          "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL,
          "num_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh"}
CONTEXT = 2048  # room for an image at an mmproj's release pixel limits (1,024 tokens at least)
ROPE = {**QWEN35_TEXT_DEFAULTS["rope_parameters"], "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1]}
CHAT_TEMPLATE = (Path(__file__).parent / "chat_templates" / "Qwen3.5-4B.jinja"
                 ).read_text(encoding="utf-8")
# Qwen/Qwen3.5's preprocessor_config.json at the tiny sizes (min / max pixels as size)
PREPROCESSOR = {
    "size": {"longest_edge": 4096, "shortest_edge": 256}, "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL, "merge_size": MERGE, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast"}


def _tokenizer_kwargs() -> dict:
    return {"chat_template": CHAT_TEMPLATE, "extra_special_tokens": {
        "image_token": IMAGE_PAD, "video_token": VIDEO_PAD,
        "vision_bos_token": VISION_START, "vision_eos_token": VISION_END}}


def make_qwen35_vl_hf(path: str | Path, seed: int = 0) -> Path:
    """Build the tiny random Qwen3.5 VLM (module docstring) and save it to ``path``; returns
    it."""
    from transformers import Qwen3_5ForConditionalGeneration
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    path = Path(path)
    vocab = len(make_tokenizer(SPECIALS, **_tokenizer_kwargs()))
    make_qwen35_hf_model(path, seed, conditional=True, vocab_size=vocab, rope_parameters=ROPE,
                         max_position_embeddings=CONTEXT)
    tokenizer = save_tokenizer(path, SPECIALS, **_tokenizer_kwargs())
    model = Qwen3_5ForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    vision = Qwen3_5VisionConfig(**VISION, out_hidden_size=model.config.text_config.hidden_size)
    model.config.vision_config = vision
    model.model.visual = Qwen3_5VisionModel(vision).to(torch.float32)
    _randomize_(model.model.visual, seed + 2)  # LayerNorms: mean 1
    ids = tokenizer.convert_tokens_to_ids(list(SPECIALS))
    for key, token_id in zip(("vision_start_token_id", "vision_end_token_id",
                              "image_token_id", "video_token_id"), ids):
        setattr(model.config, key, token_id)
    text_model = model.model.language_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        text_model.embed_tokens.weight.mul_(0.25)
        text_model.norm.weight.add_(3.0)  # Qwen3.5's norms multiply by 1 + w
    model.eval().save_pretrained(str(path))
    for name, data in (("preprocessor_config.json", PREPROCESSOR),
                       ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


# -- the mmproj GGUF -------------------------------------------------------------------------

_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def _mmproj_tensors(state: dict[str, np.ndarray], names) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of the vision tensors, as ``Qwen3VLVisionModel`` yields them:
    the Conv3d kernel as two frames, the merger's fc1 / fc2 as ``mm.0`` / ``mm.2``, its norm as
    ``v.post_ln``, the rest by gguf-py's map."""
    out = []
    for name in sorted(state):
        if not name.startswith("model.visual."):
            continue
        w, short = state[name], name.removeprefix("model.")
        if short == "visual.patch_embed.proj.weight":
            out += [("v.patch_embd.weight", w[:, :, 0]), ("v.patch_embd.weight.1", w[:, :, 1])]
        elif short == "visual.patch_embed.proj.bias":
            out.append(("v.patch_embd.bias", w))
        elif short.startswith("visual.merger.linear_fc"):
            fc, suffix = short.removeprefix("visual.merger.linear_fc").split(".")
            out.append((f"mm.{0 if fc == '1' else 2}.{suffix}", w))
        elif short.startswith("visual.merger.norm."):
            out.append((f"v.post_ln.{short.rsplit('.', 1)[1]}", w))
        else:
            gguf_name = names.get_name(short, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise KeyError(f"no mmproj name for tensor {name!r}")
            out.append((gguf_name, w))
    return out


def _mmproj_qtype(gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type: the patch kernel F16 in an f16 file, else F32; 1-D tensors and the
    position table F32; other matrices ``ftype``."""
    if ".patch_embd.weight" in gguf_name:
        return "F16" if ftype == "F16" else "F32"
    if w.ndim <= 1 or gguf_name == "v.position_embd.weight":
        return "F32"
    return ftype


def _add_mmproj_hparams(writer, config: dict, preprocessor: dict, ftype: str) -> None:
    """The keys MmprojModel and Qwen3VLVisionModel write, in their order."""
    import gguf

    v, text = config["vision_config"], config.get("text_config", {})
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text["hidden_size"])
    writer.add_vision_image_size(int(v["num_position_embeddings"] ** 0.5 * v["patch_size"]))
    writer.add_vision_patch_size(v["patch_size"])
    writer.add_vision_embedding_length(v["hidden_size"])
    writer.add_vision_feed_forward_length(v["intermediate_size"])
    writer.add_vision_block_count(v["depth"])
    writer.add_vision_head_count(v["num_heads"])
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN3VL)
    writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(v["spatial_merge_size"])
    writer.add_vision_attention_layernorm_eps(text.get("rms_norm_eps", 1e-6))
    deepstack = [False] * v["depth"]
    for index in v.get("deepstack_visual_indexes", []):
        deepstack[index] = True
    writer.add_vision_is_deepstack_layers(deepstack)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def qwen35_vl_mmproj_gguf(folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The ``qwen3vl_merger`` mmproj GGUF of a Qwen3.5 ConditionalGeneration folder's vision
    tower, as ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it (module docstring); ``ftype``
    f32, f16, bf16 or q8_0. Returns ``out_path``."""
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
    for gguf_name, w in _mmproj_tensors(_load_state_dict(folder), names):
        kind = gguf.GGMLQuantizationType[_mmproj_qtype(gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
