"""A tiny random Gemma 4 vision-language checkpoint as a release lays it out
(:func:`make_gemma4_vlm_hf`), its mmproj GGUF as llama.cpp's ``convert_hf_to_gguf.py --mmproj``
writes it (:func:`gemma4_vlm_mmproj_gguf`) and its text GGUF as the converter writes it
(:func:`gemma4_vlm_text_gguf`); benchmarks/check_tiny_gemma4_vlm_converter.py checks both.

The folder: transformers' own ``Gemma4ForConditionalGeneration`` (float32) saved with
``save_pretrained`` (``model.language_model.*``, ``model.vision_tower.*``,
``model.embed_vision.*``; the head tied, no audio tower). Text: tests/tiny_gemma4.py's ``e2b``
layout (per-layer inputs, shared KV, double-wide MLPs, 6 layers alternating sliding and global)
with a context of ``CONTEXT``; ``bidirectional=True`` sets ``use_bidirectional_attention =
"vision"`` (an image's tokens see each other on the sliding layers, as the larger releases do).
Vision (``VISION``): 2 layers, hidden 32, 2 heads of 16, patches of 4 px, 3 x 3 pooling, a
``POSITIONS``-row x / y position table (the processor's widest grid at 70 tokens is 210
patches); ``clipped=True`` turns on ``use_clipped_linears`` with finite random bounds that
bite, ``standardize=True`` the pooled rows' ``std_bias`` / ``std_scale``. Norms are drawn
around 1 (Gemma 4 multiplies by w). The token table is drawn 4x narrower and the final norm
multiplies by about 4 (as tests/tiny_smolvlm.py does): greedy answers vary with the picture.

The tokenizer is tests/tiny_models.py's with Gemma 4's specials appended (``SPECIALS``: ids
384 on, spelled as the release's: ``<|image>`` boi, ``<|image|>`` image, ``<image|>`` eoi, the
audio and video ones, turns and channels), ``<bos>`` bos, ``<turn|>`` eos, then rebuilt with
byte fallback as Gemma's are (tests/tiny_gemma4_gguf.py's ``save_byte_fallback_tokenizer``: the
converter reads it so); config.json names the specials' ids (``image_token_id``,
``boi_token_id``, ...). The release's chat template (tests/chat_templates/
google-gemma-4-31B-it.jinja) is in tokenizer_config.json and chat_template.jinja;
processor_config.json is the release's (google/gemma-4-E2B-it keeps its image settings in its
``image_processor`` block; no preprocessor_config.json is written) at the tiny sizes: patch 4,
pooling 3, 70 soft tokens at most.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tiny_gemma4 import text_config_fields
from tiny_gemma4_gguf import (
    _add_hparams,
    _add_tensor,
    _add_vocab,
    _gguf_name,
    _qtype,
    _rope_freqs,
    save_byte_fallback_tokenizer,
)
from tiny_models import _FILE_TYPES, PAD_TOKEN, _load_state_dict, _randomize_, save_tokenizer

BOS, EOS = "<bos>", "<turn|>"
BOI, IMAGE, EOI = "<|image>", "<|image|>", "<image|>"
BOA, AUDIO, EOA, VIDEO = "<|audio>", "<|audio|>", "<audio|>", "<|video|>"
SPECIALS = (BOS, "<|turn>", EOS, "<|channel>", "<channel|>", "<|think|>", BOI, IMAGE, EOI,
            BOA, AUDIO, EOA, VIDEO)
PATCH, POOL, MAX_SOFT_TOKENS, POSITIONS = 4, 3, 70, 256
CONTEXT = 1024  # room for a few images of up to 70 tokens
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
          "patch_size": PATCH, "pooling_kernel_size": POOL, "position_embedding_size": POSITIONS,
          "rms_norm_eps": 1e-6}
CHAT_TEMPLATE = (Path(__file__).parent / "chat_templates" / "google-gemma-4-31B-it.jinja"
                 ).read_text(encoding="utf-8")
# google/gemma-4-E2B-it's processor_config.json (its image part), at the tiny sizes
IMAGE_PROCESSOR = {
    "do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
    "image_mean": [0.0, 0.0, 0.0], "image_processor_type": "Gemma4ImageProcessor",
    "image_seq_length": MAX_SOFT_TOKENS, "image_std": [1.0, 1.0, 1.0],
    "max_soft_tokens": MAX_SOFT_TOKENS, "patch_size": PATCH, "pooling_kernel_size": POOL,
    "resample": 3, "rescale_factor": 1 / 255}
PROCESSOR = {"image_processor": IMAGE_PROCESSOR, "image_seq_length": MAX_SOFT_TOKENS,
             "processor_class": "Gemma4Processor"}
_TOKEN_KEYS = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE, "boa_token": BOA,
               "eoa_token": EOA, "audio_token": AUDIO, "video_token": VIDEO}
_CONFIG_IDS = {"boi_token_id": BOI, "eoi_token_id": EOI, "image_token_id": IMAGE,
               "video_token_id": VIDEO, "boa_token_id": BOA, "eoa_token_index": EOA,
               "audio_token_id": AUDIO}


def _randomize_vision_buffers_(tower, seed: int, clipped: bool, standardize: bool) -> None:
    """Finite clipping bounds (inputs at about 1.5 sigma of a norm's output, outputs at 1.5x
    a projection's typical size) and standardizing rows, where the config turns them on."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if standardize:
            tower.std_bias.copy_(0.5 * torch.randn(tower.std_bias.shape, generator=gen))
            tower.std_scale.copy_(0.5 + torch.rand(tower.std_scale.shape, generator=gen))
        if not clipped:
            return
        for name, buf in tower.named_buffers():
            if name.endswith(("input_min", "input_max", "output_min", "output_max")):
                bound = 1.5 + 0.5 * torch.rand((), generator=gen)
                buf.copy_(-bound if name.endswith("min") else bound)


def make_gemma4_vlm_hf(path: str | Path, seed: int = 0, bidirectional: bool = False,
                       clipped: bool = False, standardize: bool = False) -> Path:
    """Build the tiny random Gemma 4 VLM (module docstring) and save it to ``path``; returns
    it."""
    from transformers import (
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
        Gemma4VisionConfig,
        GenerationConfig,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, bos_token=BOS, eos_token=EOS,
                               chat_template=CHAT_TEMPLATE, extra_special_tokens=_TOKEN_KEYS)
    save_byte_fallback_tokenizer(path)
    bos, eos, pad = tokenizer.convert_tokens_to_ids([BOS, EOS, PAD_TOKEN])
    vocab = len(tokenizer)
    text = Gemma4TextConfig(
        vocab_size=vocab, vocab_size_per_layer_input=vocab, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=pad, **{**text_config_fields("e2b"), "max_position_embeddings": CONTEXT,
                             "use_bidirectional_attention": "vision" if bidirectional else None})
    vision = Gemma4VisionConfig(**VISION, use_clipped_linears=clipped, standardize=standardize)
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in _CONFIG_IDS.items()}
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                          tie_word_embeddings=True, **ids)
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(config).to(torch.float32)
    inner = model.model
    _randomize_(inner.language_model, seed, norm_mean=1.0)
    _randomize_(inner.vision_tower, seed + 2, norm_mean=1.0)
    _randomize_(inner.embed_vision, seed + 3, norm_mean=1.0)
    _randomize_vision_buffers_(inner.vision_tower, seed + 4, clipped, standardize)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # see the module docstring: greedy output worth comparing
        for layer in inner.language_model.layers:
            layer.layer_scalar.copy_(0.75 + 0.5 * torch.rand(1, generator=gen))
        inner.language_model.embed_tokens.weight.mul_(0.25)
        inner.language_model.norm.weight.mul_(4.0)
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos,
                                               pad_token_id=pad)
    model.save_pretrained(str(path))
    (path / "processor_config.json").write_text(json.dumps(PROCESSOR, indent=2) + "\n",
                                                encoding="utf-8")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return path


# -- the text GGUF ---------------------------------------------------------------------------

_MULTIMODAL = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")


def gemma4_vlm_text_gguf(folder: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """The ``gemma4`` GGUF of the text model of a :func:`make_gemma4_vlm_hf` folder, as
    ``convert_hf_to_gguf.py FOLDER`` (``Gemma4Model``) writes it: tests/tiny_gemma4_gguf.py's
    writer over the ``model.language_model.*`` tensors (``language_model.`` stripped; the
    towers and embedders are the mmproj's); ``ftype`` F32, F16 or Q8_0. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    folder, out_path = Path(folder), Path(out_path)
    text = json.loads((folder / "config.json").read_text(encoding="utf-8"))["text_config"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, text["num_hidden_layers"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "gemma4")
    _add_hparams(writer, text, ftype)
    _add_vocab(writer, folder)
    writer.add_tensor("rope_freqs.weight", _rope_freqs(text))
    for name, w in _load_state_dict(folder).items():
        if name.removeprefix("model.").startswith(_MULTIMODAL) or name == "lm_head.weight":
            continue
        gguf_name = _gguf_name(names, name.replace("language_model.", ""))
        _add_tensor(writer, gguf_name, w, _qtype(gguf_name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


# -- the mmproj GGUF -------------------------------------------------------------------------

_FTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
_SUFFIXES = (".weight", ".bias", ".input_max", ".input_min", ".output_max", ".output_min")


def _mmproj_tensors(state: dict[str, np.ndarray], names) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of the vision tensors, as ``Gemma4VisionAudioModel`` yields
    them: ``encoder.`` as ``vision_model.model.``, ``.linear`` dropped, scalars as 1-element
    rows, the patch kernel [n, 3P²] as a conv kernel [n, 3, P, P] (its columns (row, column,
    channel) → (channel, row, column)), the rest by gguf-py's map."""
    out = []
    for name, w in state.items():
        if not name.startswith(("model.vision_tower.", "model.embed_vision.")):
            continue
        w = w.reshape(1) if w.ndim == 0 else w
        name = name.replace("model.vision_tower.encoder.", "vision_model.model.")
        name = name.replace(".linear.weight", ".weight")
        if name.endswith("position_embedding_table"):
            name += ".weight"
        if name.endswith("patch_embedder.input_proj.weight"):
            side = int((w.shape[1] // 3) ** 0.5)
            w = w.reshape(w.shape[0], side, side, 3).transpose(0, 3, 1, 2)  # [n, 3, P, P]
        gguf_name = names.get_name(name, try_suffixes=_SUFFIXES)
        if gguf_name is None:
            raise KeyError(f"no mmproj name for tensor {name!r}")
        out.append((gguf_name, w))
    return out


def _mmproj_qtype(gguf_name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's type: the position table F32; the patch kernel F16 in an f16 file,
    else F32; 1-D tensors and non-``.weight`` names F32; a Q8_0 row that does not split into
    blocks F16; other matrices ``ftype``."""
    if gguf_name == "v.position_embd.weight":
        return "F32"
    if gguf_name == "v.patch_embd.weight":
        return "F16" if ftype == "F16" else "F32"
    if w.ndim <= 1 or not gguf_name.endswith(".weight"):
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"
    return ftype


def _add_mmproj_hparams(writer, config: dict, ftype: str) -> None:
    """The keys MmprojModel and Gemma4VisionAudioModel write (no audio tower)."""
    import gguf

    v = config["vision_config"]
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(config["text_config"]["hidden_size"])
    writer.add_vision_image_size(224)  # the converter's placeholder: Gemma 4 takes any size
    writer.add_vision_patch_size(v["patch_size"])
    writer.add_vision_embedding_length(v["hidden_size"])
    writer.add_vision_feed_forward_length(v["intermediate_size"])
    writer.add_vision_block_count(v["num_hidden_layers"])
    writer.add_vision_head_count(v["num_attention_heads"])
    writer.add_vision_image_mean(IMAGE_PROCESSOR["image_mean"])
    writer.add_vision_image_std(IMAGE_PROCESSOR["image_std"])
    writer.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA4V)
    writer.add_vision_attention_layernorm_eps(v.get("layer_norm_eps", 1e-6))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def gemma4_vlm_mmproj_gguf(folder: str | Path, out_path: str | Path, ftype: str = "f16") -> Path:
    """The ``gemma4v`` mmproj GGUF of a :func:`make_gemma4_vlm_hf` folder's vision tower and
    embedder, as ``convert_hf_to_gguf.py FOLDER --mmproj`` writes it; ``ftype`` f32, f16, bf16
    or q8_0. Returns ``out_path``."""
    import gguf

    if ftype.lower() not in _FTYPES:
        raise ValueError(f"ftype {ftype!r} not in {sorted(_FTYPES)}")
    ftype = _FTYPES[ftype.lower()]
    folder, out_path = Path(folder), Path(out_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ,
                                     config["vision_config"]["num_hidden_layers"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "clip")
    _add_mmproj_hparams(writer, config, ftype)
    for gguf_name, w in _mmproj_tensors(_load_state_dict(folder), names):
        kind = gguf.GGMLQuantizationType[_mmproj_qtype(gguf_name, w, ftype)]
        data = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        writer.add_tensor(gguf_name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
