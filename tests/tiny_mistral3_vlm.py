"""A tiny random Mistral 3 vision + text checkpoint (:func:`make_mistral3_vlm_hf`), its text GGUF
(:func:`mistral3_vlm_text_gguf`) and its mmproj GGUF (:func:`mistral3_vlm_mmproj_gguf`) as
llama.cpp's ``convert_hf_to_gguf.py`` writes them.

The folder: transformers' own ``Mistral3ForConditionalGeneration`` (float32, random) saved with
``save_pretrained`` (the releases' names: ``vision_tower.*``, ``multi_modal_projector.*``,
``language_model.*``). Vision: Pixtral with the releases' patch 14, SiLU MLP and 2 x 2 patch
merger, hidden 32, 2 heads of 16, 3 blocks (llama.cpp's converter maps ``linear_2`` to
``mm.2`` only for a tower of 3 blocks or more), ``image_size`` ``LONGEST_EDGE`` (the rope's
extent: 16 patches a side); text: tests/tiny_families60.py's Ministral 3 (2 layers, yarn and
Llama 4's attention temperature) with the releases' norm epsilon 1e-5 (the projector's norm
takes it) and 512 positions. The token table is drawn 4x narrower than tiny_models.py's and
the final norm multiplies by about 4 (as tests/tiny_smolvlm.py does) so that greedy answers
follow the picture (seed 0: four random 150 x 100 pictures, 4 x 6 tokens each, give four
different 10-token answers, top-2 logit margins 0.05 and more).
The tokenizer is tests/tiny_models.py's with Mistral's specials appended (``SPECIALS``, ids
384 on: ``<s>`` bos, ``</s>`` eos, ``[INST]``, ``[/INST]``, ``[SYSTEM_PROMPT]``,
``[/SYSTEM_PROMPT]``, ``[IMG]``, ``[IMG_BREAK]``, ``[IMG_END]``); config.json's
``image_token_index`` is ``[IMG]``'s id. The chat template is the Ministral 3 releases' message
loop (tests/chat_templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja: ``[IMG]`` for each
image part) without their long default system prompt and tools, to keep prompts short.
preprocessor_config.json / processor_config.json as the releases have them, at the tiny sizes
(longest edge ``LONGEST_EDGE`` px: at most 8 x 8 tokens an image).

The text GGUF: tests/tiny_families60.py's ``family_hf_to_gguf`` (``Mistral3Model``, arch
``mistral3``). The mmproj GGUF (``LlavaVisionModel``, projector ``pixtral``): gguf-py's MMPROJ
names, q and k rows permuted as llama.cpp's ``LlamaModel.permute`` does, 1-D tensors F32, the
patch kernel and the merging matrix F16 in an f16 file and F32 otherwise, the other matrices
``ftype``. benchmarks/check_tiny_mistral3_vlm_converter.py compares both with the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_families60 import _COMMON, DEFAULTS, family_hf_to_gguf
from tiny_models import (
    _FILE_TYPES,
    PAD_TOKEN,
    _load_state_dict,
    _randomize_,
    permute_qk,
    save_tokenizer,
)

IMG, IMG_BREAK, IMG_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
BOS, EOS = "<s>", "</s>"
SPECIALS = (BOS, EOS, "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", IMG,
            IMG_BREAK, IMG_END)
PATCH, MERGE, LONGEST_EDGE = 14, 2, 224
# the Ministral 3 releases' message loop (module docstring)
CHAT_TEMPLATE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + messages[0]['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' }}{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{{- '[IMG]' }}{%- endif %}"
    "{%- endfor %}{{- '[/INST]' }}{%- endif %}{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for block in message['content'] %}{%- if block['type'] == 'text' %}"
    "{{- block['text'] }}{%- endif %}{%- endfor %}{%- endif %}{{- eos_token }}"
    "{%- endif %}{%- endfor %}")
VISION_FIELDS = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
                 "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 16,
                 "patch_size": PATCH, "image_size": LONGEST_EDGE, "hidden_act": "silu",
                 "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}}
_ROPE = dict(DEFAULTS["mistral3"]["rope_parameters"], factor=32.0, max_position_embeddings=512)
TEXT_FIELDS = {**_COMMON, **DEFAULTS["mistral3"], "rms_norm_eps": 1e-5,
               "max_position_embeddings": 512, "rope_parameters": _ROPE}
# mistralai/Mistral-Small-3.1-24B-Instruct-2503's files, at the tiny sizes
PREPROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "PixtralImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": PATCH, "width": PATCH}, "processor_class": "PixtralProcessor",
    "resample": 3, "rescale_factor": 1 / 255, "size": {"longest_edge": LONGEST_EDGE}}
PROCESSOR = {"image_break_token": IMG_BREAK, "image_end_token": IMG_END, "image_token": IMG,
             "patch_size": PATCH, "processor_class": "PixtralProcessor",
             "spatial_merge_size": MERGE}


def make_mistral3_vlm_hf(path: str | Path, seed: int = 0) -> Path:
    """Build the tiny random Mistral 3 (module docstring) and save it to ``path``; returns it."""
    from transformers import (
        GenerationConfig,
        Ministral3Config,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, bos_token=BOS, eos_token=EOS,
                               chat_template=CHAT_TEMPLATE)
    bos, eos, pad, image = tokenizer.convert_tokens_to_ids([BOS, EOS, PAD_TOKEN, IMG])
    text = Ministral3Config(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos,
                            pad_token_id=pad, **TEXT_FIELDS)
    config = Mistral3Config(text_config=text.to_dict(), vision_config=dict(VISION_FIELDS),
                            image_token_index=image, spatial_merge_size=MERGE,
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).to(torch.float32)
    _randomize_(model, seed, norm_mean=1.0)
    language = model.model.language_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        language.embed_tokens.weight.mul_(0.25)
        language.norm.weight.mul_(4.0)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos,
                                               pad_token_id=pad)
    model.save_pretrained(str(path))
    for name, data in (("preprocessor_config.json", PREPROCESSOR),
                       ("processor_config.json", PROCESSOR),
                       ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def mistral3_vlm_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``mistral3`` GGUF of a :func:`make_mistral3_vlm_hf` folder's text model, as the
    converter writes it (tests/tiny_families60.py's writer); ``ftype`` F32, F16, BF16 or Q8_0."""
    return family_hf_to_gguf(folder, out_path, ftype)


# -- the mmproj GGUF -------------------------------------------------------------------------

_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
_VISION = ("vision_tower.", "multi_modal_projector.")


def _mmproj_tensors(names, config: dict, state: dict[str, np.ndarray]):
    """(gguf name, array) of the vision and projector tensors, q and k rows permuted."""
    heads = config["vision_config"]["num_attention_heads"]
    for name, w in state.items():
        if not name.startswith(_VISION):
            continue
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = permute_qk(w, heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no mmproj name for tensor {name!r}")
        yield gguf_name, w


def _mmproj_qtype(gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type (``MmprojModel.tensor_force_quant``): the patch kernel and the
    merging matrix F16 in an f16 file, else F32; 1-D F32; a Q8_0 row that does not split into
    blocks F16; the rest ``ftype``."""
    if gguf_name.startswith(("v.patch_embd.", "mm.patch_merger.")):
        return "F16" if ftype == "F16" else "F32"
    if w.ndim <= 1:
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"
    return ftype


def _add_mmproj_hparams(writer, config: dict, preprocessor: dict, ftype: str) -> None:
    """The keys MmprojModel and LlavaVisionModel write."""
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
    writer.add_clip_projector_type(gguf.VisionProjectorType.PIXTRAL)
    writer.add_vision_attention_layernorm_eps(v.get("layer_norm_eps", 1e-5))
    if v["hidden_act"] == "silu":
        writer.add_vision_use_silu(True)
    else:
        writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(config["spatial_merge_size"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def mistral3_vlm_mmproj_gguf(folder: str | Path, out_path: str | Path,
                             ftype: str = "f16") -> Path:
    """The ``pixtral`` mmproj GGUF of a :func:`make_mistral3_vlm_hf` folder, as
    ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it (module docstring); ``ftype`` f32,
    f16, bf16 or q8_0. Returns ``out_path``."""
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
    for gguf_name, w in _mmproj_tensors(names, config, _load_state_dict(folder)):
        kind = gguf.GGMLQuantizationType[_mmproj_qtype(gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
