"""`image_processor_for` (radixserve/multimodal/select.py): a Gemma 3 VLM folder, llama.cpp's
mmproj GGUF beside a text GGUF (the metadata keys convert_hf_to_gguf.py's Gemma3VisionModel
writes), text-only models, and what it refuses."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
from PIL import Image
from tiny_gemma3_vlm import IMAGE_TOKEN, TOKENS_PER_IMAGE, gemma3_vlm_text_gguf, make_gemma3_vlm_hf

from radixserve.multimodal.gemma3 import Gemma3ImageProcessor
from radixserve.multimodal.select import image_processor_for
from radixserve.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(the tiny Gemma 3 VLM folder, its tokenizer, its text GGUF, that GGUF's tokenizer)."""
    root = tmp_path_factory.mktemp("g3")
    folder = make_gemma3_vlm_hf(root / "hf")
    text_gguf = gemma3_vlm_text_gguf(folder, root / "gguf" / "tiny-gemma3.gguf")
    return folder, Tokenizer.from_hf_dir(folder), text_gguf, Tokenizer.from_gguf(text_gguf)


def write_mmproj(path, *, projector="gemma3", image_size=64, patch_size=4, scale=None,
                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
    """An mmproj GGUF's metadata as convert_hf_to_gguf.py --mmproj writes it for Gemma 3
    (MmprojModel.set_gguf_parameters + Gemma3VisionModel's; no tensors: not read here)."""
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(64)
    writer.add_vision_image_size(image_size)
    writer.add_vision_patch_size(patch_size)
    writer.add_vision_embedding_length(32)
    writer.add_vision_feed_forward_length(64)
    writer.add_vision_block_count(2)
    writer.add_vision_head_count(2)
    writer.add_vision_image_mean(list(mean))
    writer.add_vision_image_std(list(std))
    if projector is not None:
        writer.add_clip_projector_type(projector)
    writer.add_vision_attention_layernorm_eps(1e-6)
    writer.add_vision_use_gelu(True)
    if scale is not None:  # the converter writes it only where it is not 4
        writer.add_vision_projector_scale_factor(scale)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_a_gemma3_vlm_folder(vlm):
    folder, tok, _, _ = vlm
    p = image_processor_for(str(folder), None, tok)
    config = json.loads((folder / "config.json").read_text())
    assert isinstance(p, Gemma3ImageProcessor)
    assert p.image_token_id == config["image_token_index"] == tok.encode_prompt(IMAGE_TOKEN)[0]
    assert (p.size, p.num_image_tokens, p.resample) == ((64, 64), TOKENS_PER_IMAGE, 2)
    assert p.image_mean == p.image_std == (0.5, 0.5, 0.5)


def test_processor_config_json_alone(vlm, tmp_path):
    """transformers 5 saves the image processor inside processor_config.json."""
    folder, tok, _, _ = vlm
    copy = shutil.copytree(folder, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    (copy / "preprocessor_config.json").unlink()
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    processor = {"image_processor": {**settings, "size": {"height": 32, "width": 48}}}
    (copy / "processor_config.json").write_text(json.dumps(processor))
    assert image_processor_for(str(copy), None, tok).size == (32, 48)


def test_mmproj_beside_the_text_gguf_equals_the_folder(vlm, tmp_path):
    folder, tok, text_gguf, gguf_tok = vlm
    mmproj = write_mmproj(tmp_path / "mmproj-tiny-gemma3-f16.gguf")
    from_gguf = image_processor_for(str(text_gguf), mmproj, gguf_tok)
    from_folder = image_processor_for(str(folder), None, tok)
    assert from_gguf == from_folder  # tokens per image (64 / 4 / 4)^2 = 16, the same token id
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), np.uint8))
    a, b = from_gguf.process(image), from_folder.process(image)
    assert a.key == b.key and np.array_equal(a.pixels, b.pixels)


def test_the_vision_tests_mmproj_of_the_folder(vlm, tmp_path):
    """The whole mmproj (tensors too) that the vision encoder's tests write for a folder."""
    from tiny_gemma3_mmproj import gemma3_mmproj_gguf

    folder, tok, text_gguf, gguf_tok = vlm
    mmproj = gemma3_mmproj_gguf(folder, tmp_path / "mmproj-f16.gguf", "f16")
    assert (image_processor_for(str(text_gguf), str(mmproj), gguf_tok)
            == image_processor_for(str(folder), None, tok))


def test_mmproj_scale_factor_and_statistics(vlm, tmp_path):
    _, _, text_gguf, gguf_tok = vlm
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    mmproj = write_mmproj(tmp_path / "mmproj.gguf", scale=2, mean=mean, std=std)
    p = image_processor_for(str(text_gguf), mmproj, gguf_tok)
    assert p.num_image_tokens == (64 // 4 // 2) ** 2
    np.testing.assert_array_equal(np.float32(p.image_mean), np.float32(mean))
    np.testing.assert_array_equal(np.float32(p.image_std), np.float32(std))


def test_text_only_models_take_no_images(vlm, tmp_path):
    folder, tok, text_gguf, gguf_tok = vlm
    assert image_processor_for(str(text_gguf), None, gguf_tok) is None
    text_only = tmp_path / "text"
    text_only.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (text_only / "config.json").write_text(json.dumps({**config["text_config"],
                                                       "model_type": "gemma3_text",
                                                       "architectures": ["Gemma3ForCausalLM"]}))
    assert image_processor_for(str(text_only), None, tok) is None
    (text_only / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert image_processor_for(str(text_only), None, tok) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"projector": "qwen2vl_merger"}, "projector type 'qwen2vl_merger' is not supported"),
    ({"projector": None}, "not an mmproj GGUF"),
    ({"image_size": 60}, "not a multiple"),
])
def test_mmproj_refusals(vlm, tmp_path, kwargs, message):
    _, _, text_gguf, gguf_tok = vlm
    mmproj = write_mmproj(tmp_path / "mmproj.gguf", **kwargs)
    with pytest.raises(ValueError, match=message):
        image_processor_for(str(text_gguf), mmproj, gguf_tok)


def test_not_a_gguf_is_refused(vlm, tmp_path):
    _, _, text_gguf, gguf_tok = vlm
    bad = tmp_path / "mmproj.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    with pytest.raises(ValueError, match="not a valid GGUF"):
        image_processor_for(str(text_gguf), str(bad), gguf_tok)


def test_a_tokenizer_without_the_image_tokens_is_refused(vlm, tmp_path):
    from tiny_models import save_tokenizer

    folder, _, _, _ = vlm
    save_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no <start_of_image> special token"):
        image_processor_for(str(folder), None, Tokenizer.from_hf_dir(tmp_path))


def test_a_config_image_token_the_tokenizer_disagrees_with(vlm, tmp_path):
    folder, tok, _, _ = vlm
    copy = shutil.copytree(folder, tmp_path / "m", ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "image_token_index": 3}))
    with pytest.raises(ValueError, match="image_token_index 3"):
        image_processor_for(str(copy), None, tok)
