"""A tiny random Qwen3-VL checkpoint as the releases lay it out (:func:`make_qwen3_vl_hf`), its
text GGUF (:func:`qwen3_vl_text_gguf`) and its mmproj GGUF (:func:`qwen3_vl_mmproj_gguf`) as
llama.cpp's ``convert_hf_to_gguf.py`` writes them (benchmarks/check_tiny_qwen3_vl_converter.py
checks both against the real converter).

The folder: transformers' own ``Qwen3VLForConditionalGeneration`` (float32, random), saved by
``save_pretrained`` (``model.visual.*``, ``model.language_model.*``, ``lm_head``) with
config.json's text rope in the releases' spelling (``text_config.rope_scaling``
``{"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": true}`` and
``rope_theta`` beside it; transformers 5 would write ``rope_parameters``).
Text (``TEXT``): Qwen3, 3 layers, hidden 64, 4 heads of 16 (2 KV), q / k norms, interleaved
mRoPE sections [2, 3, 3]. Vision (``VISION``): 3 blocks, hidden 32, 2 heads, the releases'
patches of 16 px x 2 frames and 2 x 2 merge, an 8 x 8 learned position table, out 64, and
DEEPSTACK mergers after blocks 0 and 1 (``DEEPSTACK``), whose rows transformers adds to the
text model's hidden states after its layers 0 and 1. The token table is drawn 4x narrower and
the final norm multiplies by about 4 (as tests/tiny_qwen25_vl.py does): greedy answers follow
the picture. The tokenizer is tests/tiny_models.py's (``<|im_end|>`` eos) with Qwen's vision
specials appended (``SPECIALS``, ids 384 on); ``CHAT_TEMPLATE`` is a ChatML template that
writes an image part as the releases' do (``<|vision_start|><|image_pad|><|vision_end|>``; the
release's own template, with tools and video, is not stored here);
preprocessor_config.json as the releases' (``size`` ``{shortest_edge, longest_edge}``, mean /
std 0.5) with tiny pixel limits (``PREPROCESSOR``: 4 to 256 tokens).

The text GGUF (``Qwen3VLTextModel``, arch ``qwen3vl``): the Qwen3 model as tiny_models.py's
``hf_to_gguf`` writes a ``qwen3`` one, plus ``qwen3vl.rope.dimension_sections`` [2, 3, 3, 0]
and ``qwen3vl.n_deepstack_layers``. The mmproj GGUF (``Qwen3VLVisionModel``, projector
``qwen3vl_merger``): tests/tiny_qwen35_vl.py's, with ``clip.vision.is_deepstack_layers`` and
each deepstack merger as ``v.deepstack.B.{norm,fc1,fc2}`` (B: the block it follows).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tiny_qwen35_vl as qwen35
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
PATCH, MERGE, TEMPORAL = 16, 2, 2
DEEPSTACK = [0, 1]
MROPE_SECTION = [2, 3, 3]
CONTEXT = 2048  # room for an image at an mmproj's release pixel limits (64 tokens at least)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False}
ROPE_THETA = 5_000_000.0
VISION = {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
          "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL,
          "num_position_embeddings": 64, "out_hidden_size": 64,
          "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": DEEPSTACK}
# Qwen/Qwen3-VL-*'s preprocessor_config.json with tiny pixel limits
PREPROCESSOR = {
    "size": {"longest_edge": 256 * (PATCH * MERGE) ** 2, "shortest_edge": 4 * (PATCH * MERGE) ** 2},
    "patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}


def make_qwen3_vl_hf(path: str | Path, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """Build the tiny random Qwen3-VL (module docstring) and save it to ``path``; returns
    ``path``."""
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, eos_token=EOS, chat_template=CHAT_TEMPLATE)
    ids = dict(zip(SPECIALS, tokenizer.convert_tokens_to_ids(list(SPECIALS))))
    eos, pad = tokenizer.convert_tokens_to_ids([EOS, PAD_TOKEN])
    rope = {"rope_type": "default", "rope_theta": ROPE_THETA,
            "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True}
    text = {**TEXT, "vocab_size": len(tokenizer), "bos_token_id": pad, "eos_token_id": eos,
            "rope_parameters": rope, "tie_word_embeddings": tie_word_embeddings}
    config = Qwen3VLConfig(
        text_config=text, vision_config=dict(VISION), image_token_id=ids[IMAGE_PAD],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END], tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32)
    _randomize_(model, seed, norm_mean=1.0)
    language = model.model.language_model
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        language.embed_tokens.weight.mul_(0.25)
        language.norm.weight.mul_(4.0)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos,
                                               pad_token_id=pad)
    model.save_pretrained(str(path))
    _release_config(path / "config.json")
    for name, data in (("preprocessor_config.json", PREPROCESSOR),
                       ("chat_template.json", {"chat_template": CHAT_TEMPLATE})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _release_config(config_path: Path) -> None:
    """transformers 5's ``text_config.rope_parameters`` → the releases' ``rope_scaling`` and
    ``rope_theta``."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    text = config["text_config"]
    rope = text.pop("rope_parameters")
    text["rope_theta"] = rope.pop("rope_theta")
    text["rope_scaling"] = rope
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


# -- the text GGUF ---------------------------------------------------------------------------

def _text_state(folder: Path) -> dict[str, np.ndarray]:
    """The text model's tensors under Qwen3's names (``model.X``, ``lm_head.weight``)."""
    state = {}
    for name, w in _load_state_dict(folder).items():
        if not name.startswith("model.visual."):
            state[name.replace("model.language_model.", "model.", 1)] = w
    return state


def qwen3_vl_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``qwen3vl`` GGUF of a :func:`make_qwen3_vl_hf` folder's text model, as the converter
    writes it (module docstring); ``ftype`` F32, F16 or Q8_0."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = {**config["text_config"], "tie_word_embeddings": config["tie_word_embeddings"]}
    text.pop("rope_scaling")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "qwen3vl")
    writer.add_type(gguf.GGUFType.MODEL)
    _add_text_hparams(writer, config, ftype)
    _add_tokenizer(writer, folder, text["vocab_size"])
    writer.add_bos_token_id(text["bos_token_id"])  # the converter takes it from config.json
    for name, w in _gguf_tensors("qwen3", text, _text_state(folder)).items():
        _add_tensor(writer, name, w, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def _add_text_hparams(writer, config: dict, ftype: str) -> None:
    """The keys ``Qwen3VLTextModel`` writes, the mRoPE sections padded to four."""
    import gguf

    text = config["text_config"]
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(text["num_hidden_layers"])
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    sections = list(text["rope_scaling"]["mrope_section"])
    writer.add_rope_dimension_sections((sections + [0] * 4)[:4])
    writer.add_rope_freq_base(text["rope_theta"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    writer.add_num_deepstack_layers(len(config["vision_config"]["deepstack_visual_indexes"]))


# -- the mmproj GGUF -------------------------------------------------------------------------

_DEEPSTACK_PARTS = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}


def _mmproj_tensors(state: dict[str, np.ndarray], names, deepstack: list[int]):
    """(GGUF name, float32 array) of the vision tensors in the converter's order: a deepstack
    merger's as ``v.deepstack.B.*`` (B: the block it follows), the rest as Qwen3.5's."""
    out = []
    for name in sorted(state):
        prefix = "model.visual.deepstack_merger_list."
        if name.startswith(prefix):
            merger, part, suffix = name.removeprefix(prefix).split(".")
            gguf_name = f"v.deepstack.{deepstack[int(merger)]}.{_DEEPSTACK_PARTS[part]}.{suffix}"
            out.append((gguf_name, state[name]))
        else:
            out += qwen35._mmproj_tensors({name: state[name]}, names)
    return out


def qwen3_vl_mmproj_gguf(folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The ``qwen3vl_merger`` mmproj GGUF of a :func:`make_qwen3_vl_hf` folder's vision tower,
    as ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it (module docstring); ``ftype`` f32,
    f16, bf16 or q8_0. Returns ``out_path``."""
    import gguf

    if ftype.lower() not in qwen35._FTYPES:
        raise ValueError(f"ftype {ftype!r} not in {sorted(qwen35._FTYPES)}")
    ftype = qwen35._FTYPES[ftype.lower()]
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
    vision = config["vision_config"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision["depth"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "clip")
    qwen35._add_mmproj_hparams(writer, config, preprocessor, ftype)
    for gguf_name, w in _mmproj_tensors(_load_state_dict(folder), names,
                                        vision["deepstack_visual_indexes"]):
        kind = gguf.GGMLQuantizationType[qwen35._mmproj_qtype(gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
