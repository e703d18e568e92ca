"""Qwen3-VL's text model (models/qwen3_vl_config.py): a Qwen3 decoder with interleaved mRoPE,
read from a ``Qwen3VLForConditionalGeneration`` folder (tests/tiny_qwen3_vl.py: the releases'
``text_config.rope_scaling``) and from the converter's ``qwen3vl`` GGUF; ``ModelConfig.mrope``
set from either; on text its logits equal transformers' (mRoPE over equal positions is plain
rope); the tower is never read. Also: the image processor a Qwen3-VL folder or mmproj gets,
and the fixture's greedy answers following the picture in transformers."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors
import tiny_qwen3_vl as tiny
import torch
from PIL import Image
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from transformers import Qwen3VLForConditionalGeneration

from radixserve.kernels import native
from radixserve.model_config import MRopeParams
from radixserve.models.loader import load_model_config
from radixserve.models.qwen3_vl_config import qwen3_vl_hf_config
from radixserve.models.source import ModelSource
from radixserve.multimodal.select import image_processor_for
from radixserve.tokenizer.tokenizer import Tokenizer

ATOL = 1e-4
ARCH = "Qwen3VLForConditionalGeneration"
MROPE = MRopeParams((2, 3, 3), interleaved=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl-text")
    return {"plain": tiny.make_qwen3_vl_hf(root / "plain", seed=4),
            "tied": tiny.make_qwen3_vl_hf(root / "tied", seed=5, tie_word_embeddings=True)}


@pytest.fixture(scope="module")
def references(folders):
    return {name: Qwen3VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32).eval() for name, path in folders.items()}


@pytest.fixture(scope="module")
def text_files(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl-gguf")
    files = {ftype: tiny.qwen3_vl_text_gguf(folders["plain"], root / f"{ftype}.gguf", ftype)
             for ftype in ("F32", "Q8_0")}
    files["tied"] = tiny.qwen3_vl_text_gguf(folders["tied"], root / "tied.gguf", "F32")
    return files


@pytest.mark.parametrize("which", ["plain", "tied"])
def test_folder_config_has_interleaved_mrope_and_qk_norm(which, folders):
    config = load_model_config(ModelSource.resolve(str(folders[which])))
    assert config.architecture == ARCH and config.mrope == MROPE and config.qk_norm
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim) == (3, 64, 4, 2, 16)
    assert not config.attention_bias and config.rope_theta == tiny.ROPE_THETA
    assert config.rope_scaling is None and config.vocab_size == 389
    assert config.tie_word_embeddings == (which == "tied")


@pytest.mark.parametrize("which", ["F32", "tied"])
def test_gguf_config_says_the_same(which, folders, text_files):
    hf = load_model_config(ModelSource.resolve(str(
        folders["tied" if which == "tied" else "plain"])))
    gg = load_model_config(ModelSource.resolve(str(text_files[which])))
    assert gg.architecture == ARCH and gg.mrope == MROPE
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size", "rope_theta", "attention_bias", "qk_norm",
                  "tie_word_embeddings", "intermediate_size", "rope_scaling"):
        assert getattr(gg, field) == getattr(hf, field), field
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)  # a float32 in the file


def test_configs_refused_and_transformers5_spelling():
    base = {"architectures": [ARCH], "tie_word_embeddings": False}
    text = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "head_dim": 16, "vocab_size": 10}
    saved = {"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 3, 3],
             "mrope_interleaved": True}
    ok = qwen3_vl_hf_config({**base, "text_config": {**text, "rope_parameters": saved}}, ARCH)
    assert ok.mrope == MROPE and ok.rope_theta == 1000.0 and ok.qk_norm
    for rope, extra, match in (
            ({"rope_type": "yarn", "factor": 2.0, "mrope_section": [2, 3, 3]}, {},
             "rope type 'yarn'"),
            ({"rope_type": "default", "mrope_section": [2, 3]}, {}, "must sum to half"),
            ({"rope_type": "default"}, {}, "must sum to half"),  # [24, 20, 20]: not 16-wide
            (saved, {"attention_bias": True}, "attention_bias")):
        with pytest.raises(ValueError, match=match):
            qwen3_vl_hf_config({**base, "text_config": {**text, **extra,
                                                        "rope_scaling": rope}}, ARCH)


@pytest.mark.parametrize("which", ["plain", "tied"])
def test_folder_logits_equal_transformers_without_reading_the_tower(
        which, folders, references, monkeypatch):
    read: list[str] = []
    opened = safetensors.safe_open

    class Recording:
        def __init__(self, *args, **kwargs) -> None:
            self.inner = opened(*args, **kwargs)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    runner = runner_for(folders[which])
    monkeypatch.undo()
    assert read and not [n for n in read if "visual" in n]
    tokens = prompts(runner.config.vocab_size, (30, 11), seed=1)
    paged = Paged(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(references[which], t), atol=ATOL, rtol=0)


@pytest.mark.parametrize("which", ["F32", "tied"])
def test_gguf_f32_logits_equal_transformers(which, text_files, references):
    runner = runner_for(text_files[which])
    tokens = prompts(runner.config.vocab_size, (19,), seed=2)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 19)])[0]
    want = hf_logits(references["tied" if which == "tied" else "plain"], tokens[0])
    torch.testing.assert_close(ours, want, atol=ATOL, rtol=0)


def test_gguf_q8_0_as_stored_is_close_to_transformers(text_files, references):
    runner = runner_for(text_files["Q8_0"], quantization="gguf" if native.load() else "none")
    tokens = prompts(runner.config.vocab_size, (23,), seed=3)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 23)])[0]
    diff = (ours - hf_logits(references["plain"], tokens[0])).abs()
    assert diff.mean() < 0.15, diff.mean()  # a wrong name or rope is off by the logits' std


def test_image_processor_of_folder_and_mmproj(folders, tmp_path):
    folder = folders["plain"]
    tokenizer = Tokenizer.from_hf_dir(folder)
    ours = image_processor_for(str(folder), None, tokenizer)
    assert (ours.family, ours.patch_size, ours.merge_size, ours.min_pixels,
            ours.max_pixels) == ("qwen3-vl", 16, 2, 4 * 32 * 32, 256 * 32 * 32)
    assert ours.image_mean == (0.5, 0.5, 0.5) and ours.image_std == (0.5, 0.5, 0.5)
    assert ours.image_token_id == tokenizer.encode_prompt(tiny.IMAGE_PAD)[0]
    mmproj = tiny.qwen3_vl_mmproj_gguf(folder, tmp_path / "mmproj.gguf", "f16")
    theirs = image_processor_for(str(tmp_path / "text.gguf"), str(mmproj), tokenizer)
    assert (theirs.family, theirs.patch_size, theirs.merge_size, theirs.min_pixels,
            theirs.max_pixels) == ("qwen3-vl", 16, 2, 65536, 16777216)


def _answer(model, tokenizer, image: Image.Image) -> list[int]:
    """transformers' greedy answer to a question about ``image`` (slow image processor)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    processor = Qwen2VLImageProcessorPil(**{k: v for k, v in tiny.PREPROCESSOR.items()
                                            if not k.endswith(("_class", "_type"))})
    pixels = processor(images=[image], return_tensors="pt")
    tokens = int(pixels["image_grid_thw"].prod()) // tiny.MERGE ** 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
        add_generation_prompt=True, tokenize=False).replace(tiny.IMAGE_PAD,
                                                            tiny.IMAGE_PAD * tokens)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    image_token = tokenizer.convert_tokens_to_ids(tiny.IMAGE_PAD)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             mm_token_type_ids=(ids == image_token).int(),
                             pixel_values=pixels["pixel_values"],
                             image_grid_thw=pixels["image_grid_thw"], max_new_tokens=6,
                             min_new_tokens=6, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_fixture_greedy_answers_follow_the_picture(folders, references):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["plain"])
    rng = np.random.default_rng(0)
    answers = [_answer(references["plain"], tokenizer,
                       Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)))
               for _ in range(3)]
    assert len({tuple(a) for a in answers}) > 1, answers
