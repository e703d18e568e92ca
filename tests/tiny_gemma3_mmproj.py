"""A tiny Gemma 3 vision checkpoint and its llama.cpp mmproj GGUF, for the vision encoder tests.

``make_gemma3_vision_hf`` saves a tiny random ``Gemma3ForConditionalGeneration`` (transformers'
own class, float32; vision: 64 px images, 4 px patches (16 x 16), hidden 32, 2 layers, 2 heads,
16 tokens per image) with a release's preprocessor_config.json, its tensors named as releases
name them (``vision_tower.vision_model.*``, what llama.cpp's converter reads) or as
transformers 5 saves them (``vision_tower.*``).

``gemma3_mmproj_gguf`` writes the vision tower and projector as ``convert_hf_to_gguf.py FOLDER
--mmproj`` (``Gemma3VisionModel``) does: ``general.architecture`` clip, ``general.type`` mmproj,
the ``clip.*`` keys; tensors in the checkpoint's (sorted) order under gguf-py's MMPROJ names;
the projector's norm stored as ``1 + w``; the input projection as it is ([vision, text]) and
always F16; the patch and position embeddings (the conv kernel [hidden, 3, p, p] as it is) F32;
1-D tensors F32; the other matrices ``ftype`` (a Q8_0 row that does not split into blocks falls
back to F16). benchmarks/check_tiny_gemma3_mmproj_converter.py compares it with the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny_models import _FILE_TYPES, _load_state_dict, _randomize_

TOKENS_PER_IMAGE = 16
IMAGE_SIZE = 64
_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
_PREPROCESSOR = {  # a release's preprocessor_config.json, at the tiny image size
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type":
    "Gemma3ImageProcessor", "image_seq_length": TOKENS_PER_IMAGE, "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor",
    "resample": 2, "rescale_factor": 0.00392156862745098,
    "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}


def make_gemma3_vision_hf(out_dir: str | Path, seed: int = 0, layout: str = "release") -> Path:
    """Save the tiny model (see the module docstring) to ``out_dir``; ``layout`` "release"
    (``vision_tower.vision_model.*``) or "transformers5" (as ``save_pretrained`` names them).
    Returns ``out_dir``."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    if layout not in ("release", "transformers5"):
        raise ValueError(f"layout {layout!r} not in ('release', 'transformers5')")
    out_dir = Path(out_dir)
    config = Gemma3Config(
        text_config={"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "head_dim": 32, "sliding_window": 8, "max_position_embeddings": 256},
        vision_config={"image_size": IMAGE_SIZE, "patch_size": 4, "hidden_size": 32,
                       "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "vision_use_head": False},
        mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=290, eoi_token_index=291,
        image_token_index=292)
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).float().eval()
    _randomize_(model, seed, norm_mean=0.0)  # Gemma's norms multiply by 1 + w
    model.save_pretrained(str(out_dir))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(_PREPROCESSOR, indent=2))
    if layout == "release":
        path = str(out_dir / "model.safetensors")
        state = load_file(path)
        save_file({_release_name(k): v for k, v in state.items()}, path,
                  metadata={"format": "pt"})
    return out_dir


def _release_name(name: str) -> str:
    tower = "vision_tower."
    if name.startswith(tower) and not name.startswith(tower + "vision_model."):
        return tower + "vision_model." + name[len(tower):]
    return name


def _gguf_name(names, name: str) -> str | None:
    """The converter's name (``Gemma3VisionModel.filter_tensors``), None for a skipped one."""
    name = name.removeprefix("model.")
    if name.startswith("vision_tower."):
        name = _release_name(name)
    elif not name.startswith("multi_modal_projector."):
        return None  # the text model's
    gguf_name = names.get_name(name.replace("_weight", ".weight"), try_suffixes=(".weight",
                                                                               ".bias"))
    if gguf_name is None:
        raise KeyError(f"no mmproj name for tensor {name!r}")
    return gguf_name


def _qtype(hf_name: str, gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type choice (see the module docstring)."""
    if "input_projection" in hf_name:
        return "F16"
    if ".embeddings." in hf_name or w.ndim <= 1 or not gguf_name.endswith(".weight"):
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"
    return ftype


def _add_tensor(writer, name: str, w: np.ndarray, qtype: str) -> None:
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
    writer.add_tensor(name, data, raw_dtype=kind)


def _add_hparams(writer, config: dict, preprocessor: dict, ftype: str) -> None:
    """The keys MmprojModel and Gemma3VisionModel write, in their order."""
    import gguf

    v, text = config["vision_config"], config.get("text_config") or {}
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text.get("hidden_size", config.get("hidden_size")))
    writer.add_vision_image_size(v["image_size"])
    writer.add_vision_patch_size(v["patch_size"])
    writer.add_vision_embedding_length(v["hidden_size"])
    writer.add_vision_feed_forward_length(v["intermediate_size"])
    writer.add_vision_block_count(v["num_hidden_layers"])
    writer.add_vision_head_count(v["num_attention_heads"])
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    writer.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    writer.add_vision_attention_layernorm_eps(v.get("layer_norm_eps", 1e-6))
    writer.add_vision_use_gelu(True)
    per_side = int(preprocessor.get("image_seq_length", 256) ** 0.5)
    scale = (v["image_size"] // v["patch_size"]) // per_side
    if scale > 0 and scale != 4:
        writer.add_vision_projector_scale_factor(scale)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def gemma3_mmproj_gguf(hf_folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The mmproj GGUF of ``hf_folder``'s vision tower and projector (see the module
    docstring); ``ftype`` f32, f16, bf16 or q8_0. Returns ``out_path``."""
    import gguf

    if ftype.lower() not in _FTYPES:
        raise ValueError(f"ftype {ftype!r} not in {sorted(_FTYPES)}")
    ftype = _FTYPES[ftype.lower()]
    hf_folder, out_path = Path(hf_folder), Path(out_path)
    config = json.loads((hf_folder / "config.json").read_text(encoding="utf-8"))
    preprocessor = json.loads((hf_folder / "preprocessor_config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ,
                                     config["vision_config"]["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(out_path), "clip")
    _add_hparams(writer, config, preprocessor, ftype)
    for name, w in _load_state_dict(hf_folder).items():
        if "vision_model.head." in name or (gguf_name := _gguf_name(names, name)) is None:
            continue
        if "soft_emb_norm.weight" in gguf_name:
            w = w + 1  # the converter stores Gemma's 1 + w
        _add_tensor(writer, gguf_name, w, _qtype(name, gguf_name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
