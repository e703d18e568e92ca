"""A tiny random SmolVLM checkpoint as a release lays it out (:func:`make_smolvlm_hf`), its text
GGUF (:func:`smolvlm_text_gguf`) and its mmproj GGUF (:func:`smolvlm_mmproj_gguf`) as llama.cpp's
``convert_hf_to_gguf.py`` writes them.

The folder: transformers' own ``SmolVLMForConditionalGeneration`` (float32) saved with
``save_pretrained`` (``model.vision_model.*``, ``model.connector.*``, ``model.text_model.*``,
``lm_head``); vision: SigLIP as SmolVLM runs it, tiles of 64 px, patch 8 (8 x 8 patches),
hidden 32, 2 layers, 2 heads; connector: pixel shuffle by 2 (16 tokens a tile) and the linear
modality projection to the text width; text: Llama, 2 layers, hidden 64, 4 heads (2 KV), its
``text_config`` naming ``VLlama3ForCausalLM`` as the releases do (what the converter reads).
The token table is drawn 4x narrower than tiny_models.py's and the final norm multiplies by
about 4 (as tests/tiny_gemma3_vlm.py does): greedy answers then vary with the picture (seed 1:
top-2 margins of 0.05 and more over 10 tokens about two 150 x 100 pictures) instead of one
token repeated.
The tokenizer is tests/tiny_models.py's with SmolVLM's specials appended (``SPECIALS``):
``<|im_start|>`` bos, ``<end_of_utterance>`` eos, ``<image>``, ``<fake_token_around_image>``,
``<global-img>`` and ``<row_i_col_j>`` for the grids up to ``MAX_GRID`` x ``MAX_GRID``; the
release's chat template (HuggingFaceTB/SmolVLM-256M-Instruct) in tokenizer_config.json and
chat_template.json; preprocessor_config.json / processor_config.json as the releases have them,
at the tiny sizes (image splitting on, tiles of ``TILE`` px, longest edge ``MAX_GRID`` tiles).

The text GGUF (``LlamaModel``): ``text_model.`` stripped, vision and connector dropped, Q/K
rows permuted, as tests/tiny_models.py's ``hf_to_gguf`` writes a Llama (plus ``general.type``). The mmproj GGUF
(``SmolVLMModel``, projector type ``idefics3``): tensors under gguf-py's MMPROJ names, the
embeddings F32, 1-D tensors F32, other matrices ``ftype``.
benchmarks/check_tiny_smolvlm_converter.py compares both with the real converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_models import (
    _FILE_TYPES,
    PAD_TOKEN,
    _add_hparams,
    _add_tokenizer,
    _gguf_tensors,
    _load_state_dict,
    _randomize_,
    save_tokenizer,
)
from tiny_models import _add_tensor as _add_llama_tensor

TILE, PATCH, SCALE = 64, 8, 2
TOKENS_PER_TILE = (TILE // PATCH // SCALE) ** 2  # 16
MAX_GRID = 3  # longest edge: 3 tiles
IMAGE, FAKE, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"
BOS, EOS = "<|im_start|>", "<end_of_utterance>"
GRID_TOKENS = tuple(f"<row_{r}_col_{c}>" for r in range(1, MAX_GRID + 1)
                    for c in range(1, MAX_GRID + 1))
SPECIALS = (BOS, EOS, FAKE, IMAGE, GLOBAL, *GRID_TOKENS)
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
TEXT_FIELDS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
               "rms_norm_eps": 1e-5, "rope_theta": 100_000.0, "tie_word_embeddings": False,
               "architectures": ["VLlama3ForCausalLM"]}
VISION_FIELDS = {"image_size": TILE, "patch_size": PATCH, "hidden_size": 32,
                 "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
# HuggingFaceTB/SmolVLM-256M-Instruct's files, at the tiny sizes
PREPROCESSOR = {
    "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
    "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "SmolVLMImageProcessor", "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": TILE}, "processor_class": "SmolVLMProcessor",
    "resample": 1, "rescale_factor": 1 / 255, "size": {"longest_edge": MAX_GRID * TILE}}
PROCESSOR = {"image_seq_len": TOKENS_PER_TILE, "processor_class": "SmolVLMProcessor"}


def make_smolvlm_hf(path: str | Path, seed: int = 0) -> Path:
    """Build the tiny random SmolVLM (module docstring) and save it to ``path``; returns it."""
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMVisionConfig,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(
        path, SPECIALS, bos_token=BOS, eos_token=EOS, chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"fake_image_token": FAKE, "image_token": IMAGE,
                              "global_image_token": GLOBAL})
    bos, eos, pad, image = tokenizer.convert_tokens_to_ids([BOS, EOS, PAD_TOKEN, IMAGE])
    text = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos,
                       pad_token_id=pad, **TEXT_FIELDS)
    config = SmolVLMConfig(text_config=text, vision_config=SmolVLMVisionConfig(**VISION_FIELDS),
                           scale_factor=SCALE, image_token_id=image, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = SmolVLMForConditionalGeneration(config).to(torch.float32)
    _randomize_(model, seed, norm_mean=1.0)
    text_model = model.model.text_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        text_model.embed_tokens.weight.mul_(0.25)
        text_model.norm.weight.mul_(4.0)
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

def smolvlm_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``llama`` GGUF of the text model of a :func:`make_smolvlm_hf` folder, as the
    converter writes it (module docstring): the folder's ``text_config`` and
    ``model.text_model.*`` / ``lm_head`` tensors written as tests/tiny_models.py's
    ``hf_to_gguf`` writes a Llama, with the ``general.type`` the converter adds; ``ftype`` F32,
    F16 or Q8_0. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = dict(config["text_config"], tie_word_embeddings=config.get(
        "tie_word_embeddings", config["text_config"].get("tie_word_embeddings", False)))
    state = {n: w for k, w in _load_state_dict(folder).items()
             if (n := _text_name(k)) is not None}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "llama")
    writer.add_type(gguf.GGUFType.MODEL)
    _add_hparams(writer, "llama", text, ftype)
    _add_tokenizer(writer, folder, text["vocab_size"])
    for name, w in _gguf_tensors("llama", text, state).items():
        _add_llama_tensor(writer, name, w, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _text_name(name: str) -> str | None:
    """The converter's text name (``LlamaModel.filter_tensors``: ``text_model.`` stripped;
    ``SmolVLMModel``'s vision and connector tensors are not the text model's)."""
    if name.startswith(("model.vision_model.", "model.connector.")):
        return None
    return name.replace("text_model.", "", 1)


# -- the mmproj GGUF -------------------------------------------------------------------------

_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def _mmproj_name(names, name: str) -> str | None:
    """gguf-py's MMPROJ name of a vision or connector tensor, None for the text model's."""
    if not name.startswith(("model.vision_model.", "model.connector.")):
        return None
    gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
    if gguf_name is None:
        raise KeyError(f"no mmproj name for tensor {name!r}")
    return gguf_name


def _mmproj_qtype(hf_name: str, gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type (``SmolVLMModel.tensor_force_quant``: embeddings F32; 1-D and
    biases F32; a Q8_0 row that does not split into blocks F16)."""
    if ".embeddings." in hf_name or w.ndim <= 1 or not gguf_name.endswith(".weight"):
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"
    return ftype


def _add_mmproj_hparams(writer, config: dict, preprocessor: dict, ftype: str) -> None:
    """The keys MmprojModel and SmolVLMModel write, in their order."""
    import gguf

    v = config["vision_config"]
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(config["text_config"]["hidden_size"])
    writer.add_vision_image_size(v["image_size"])
    writer.add_vision_patch_size(v["patch_size"])
    writer.add_vision_embedding_length(v["hidden_size"])
    writer.add_vision_feed_forward_length(v["intermediate_size"])
    writer.add_vision_block_count(v["num_hidden_layers"])
    writer.add_vision_head_count(v["num_attention_heads"])
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    writer.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    writer.add_vision_attention_layernorm_eps(v.get("layer_norm_eps", 1e-5))
    writer.add_vision_projector_scale_factor(config.get("scale_factor", 2))
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(
        preprocessor.get("size", {}).get("longest_edge", v["image_size"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def smolvlm_mmproj_gguf(folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The ``idefics3`` mmproj GGUF of a :func:`make_smolvlm_hf` folder's vision tower and
    connector, as ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it (module docstring);
    ``ftype`` f32, f16, bf16 or q8_0. Returns ``out_path``."""
    import gguf

    if ftype.lower() not in _FTYPES:
        raise ValueError(f"ftype {ftype!r} not in {sorted(_FTYPES)}")
    ftype = _FTYPES[ftype.lower()]
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ,
                                     config["vision_config"]["num_hidden_layers"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "clip")
    _add_mmproj_hparams(writer, config, preprocessor, ftype)
    for name, w in _load_state_dict(folder).items():
        if (gguf_name := _mmproj_name(names, name)) is None:
            continue
        kind = gguf.GGMLQuantizationType[_mmproj_qtype(name, gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
