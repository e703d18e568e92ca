"""The text model of a Gemma 3 vision checkpoint (``Gemma3ForConditionalGeneration``, every
Gemma 3 release of 4B and up): the tiny one of tests/tiny_gemma3_vlm.py as a folder (either
transformers layout of its weights, float32 and bfloat16 as stored) and as the text GGUF
llama.cpp's converter writes for it (F32, Q8_0), against transformers' own
``Gemma3ForConditionalGeneration`` on text-only prompts: logits, and ``LLM``'s greedy tokens =
its ``generate``. A release's config.json (text_config naming only what differs from
transformers' defaults) reads as transformers reads it; the vision tower is never read; the
image tokens are the same ids through the GGUF's tokenizer as through the folder's."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import safetensors
import torch
from safetensors.torch import load_file, save_file
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from tiny_gemma3_vlm import BOI, EOI, IMAGE_TOKEN, gemma3_vlm_text_gguf, make_gemma3_vlm_hf
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from radixserve.kernels import native
from radixserve.models.gemma_config import gemma_hf_config
from radixserve.models.loader import load_model_config
from radixserve.models.source import ModelSource
from radixserve.tokenizer.tokenizer import load_tokenizer

ATOL = 1e-4
# Q8_0 as stored rounds weights and activations to 8 bits: a mean absolute difference under
# this (a wrong norm, name or rope is off by about the logits' std, 1 to 2)
Q8_MEAN_ATOL = 0.15
ARCH = "Gemma3ForConditionalGeneration"
needs_native = pytest.mark.skipif(native.load() is None, reason="as stored needs the native "
                                  "kernels")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_gemma3_vlm_hf(tmp_path_factory.mktemp("gemma3-vlm") / "hf", seed=5)


@pytest.fixture(scope="module")
def reference(folder):
    return Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def files(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-vlm-gguf")
    return {ftype: gemma3_vlm_text_gguf(folder, root / f"{ftype}.gguf", ftype)
            for ftype in ("F32", "Q8_0")}


def _config(path):
    return load_model_config(ModelSource.resolve(str(path)))


def _relaid(folder, dst, rename, dtype=None):
    """A copy of ``folder`` whose weights are renamed by ``rename`` (and cast to ``dtype``)."""
    shutil.copytree(folder, dst)
    weights = load_file(str(dst / "model.safetensors"))
    save_file({rename(k): v if dtype is None else v.to(dtype) for k, v in weights.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _as_5x(name: str) -> str:
    """transformers 5's in-memory names: ``model.language_model.*``, ``model.vision_tower.*``,
    ``model.multi_modal_projector.*`` (the head stays ``lm_head``)."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return name if name.startswith("language_model.") else "model." + name


def test_folder_config_is_its_text_config_and_the_gguf_says_the_same(folder, files):
    hf = _config(folder)
    assert hf.architecture == ARCH and hf.num_layers == 6 and hf.vocab_size == 390
    assert [hf.layer_window(i) for i in range(6)] == [8] * 5 + [None]
    assert hf.qk_norm and hf.tie_word_embeddings
    assert (hf.rope_theta, hf.gemma.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert hf.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert hf.gemma.query_pre_attn_scalar == 16.0
    for ftype, path in files.items():
        gg = _config(path)
        assert gg.architecture == "Gemma3ForCausalLM", ftype
        assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)  # stored as float32
        assert dataclasses.replace(gg, architecture=ARCH, rms_norm_eps=hf.rms_norm_eps) == hf


# google/gemma-3-4b-it's and gemma-3-27b-it's config.json (transformers 4.50): the text_config
# names only what differs from Gemma3TextConfig's defaults
RELEASES = {
    "4b": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
           "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
           "sliding_window": 1024},
    "27b": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
}


@pytest.mark.parametrize("release", RELEASES)
def test_release_config_json_reads_as_transformers_reads_it(release):
    """The release's sparse text_config = transformers' expansion of it (5.x layout: every
    field, one rope dict per layer type)."""
    sparse = {"architectures": [ARCH], "model_type": "gemma3", "mm_tokens_per_image": 256,
              "text_config": RELEASES[release],
              "vision_config": {"model_type": "siglip_vision_model", "image_size": 896,
                                "patch_size": 14, "vision_use_head": False}}
    expanded = Gemma3Config(**{k: v for k, v in sparse.items() if k != "architectures"})
    full = dict(expanded.to_dict(), architectures=[ARCH])
    assert "rope_parameters" in full["text_config"]
    ours = gemma_hf_config(sparse, ARCH)
    assert ours == gemma_hf_config(full, ARCH)
    text = expanded.text_config
    assert (ours.vocab_size, ours.head_dim, ours.num_kv_heads) == (
        text.vocab_size, text.head_dim, text.num_key_value_heads)
    assert ours.gemma.query_pre_attn_scalar == text.query_pre_attn_scalar
    assert ours.sliding_layers == tuple(t == "sliding_attention" for t in text.layer_types)
    assert (ours.rope_theta, ours.gemma.rope_local_theta) == (1_000_000.0, 10_000.0)


@pytest.mark.parametrize("text_config,match", [
    ({"model_type": "gemma3n_text"}, "unsupported Gemma 3 text model 'gemma3n_text'"),
    ({"use_bidirectional_attention": True}, "bidirectional attention.*not supported"),
])
def test_text_models_that_do_not_run_are_refused(text_config, match):
    with pytest.raises(ValueError, match=match):
        gemma_hf_config({"architectures": [ARCH], "text_config": text_config}, ARCH)


@pytest.mark.parametrize("layout", ["4.5x", "5.x"])
def test_either_weight_layout_loads_without_reading_the_vision_tower(layout, folder, reference,
                                                                     tmp_path, monkeypatch):
    """transformers 4.5x's names (``language_model.model.*``; what 5.25's save_pretrained
    writes too) and 5.x's in-memory ones (``model.language_model.*``): the same logits as
    transformers; no vision or projector tensor is read."""
    with safetensors.safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("language_model.model.layers.") for n in names)
    path = folder if layout == "4.5x" else _relaid(folder, tmp_path / "v5", _as_5x)
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
    runner = runner_for(path)
    monkeypatch.undo()
    assert read and not [n for n in read if "vision_tower" in n or "multi_modal" in n]
    tokens = prompts(runner.config.vocab_size, (30, 11), seed=1)
    paged = Paged(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


@needs_native
def test_bfloat16_folder_as_stored_loads_its_text_model(folder, tmp_path):
    """A release's bfloat16 weights kept in 16 bits (what ``auto`` picks on CPU): the text
    model's linears from the file, the vision tower skipped; logits = transformers' on the
    same rounded weights."""
    path = _relaid(folder, tmp_path / "bf16", _as_5x, torch.bfloat16)
    runner = runner_for(path, quantization="16bit-stored")
    want = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    tokens = prompts(runner.config.vocab_size, (21,), seed=4)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 21)])[0]
    torch.testing.assert_close(ours, hf_logits(want, tokens[0]), atol=1e-3, rtol=0)


def test_f32_file_logits_equal_transformers(files, reference):
    runner = runner_for(files["F32"])
    tokens = prompts(runner.config.vocab_size, (19, 13), seed=2)
    paged = Paged(tokens, 4)
    got: list[list[torch.Tensor]] = [[], []]
    for step in ([(0, 9), (1, 8)], [(0, 6), (1, 1)], [(0, 1), (1, 4)], [(0, 3)]):
        for (i, _), logits in zip(step, runner.all_logits([paged.chunk(i, n) for i, n in step])):
            got[i].append(logits)
    for i, toks in enumerate(tokens):
        torch.testing.assert_close(torch.cat(got[i]), hf_logits(reference, toks), atol=ATOL,
                                   rtol=0)


@needs_native
def test_q8_file_as_stored_is_close_to_transformers(files, reference):
    runner = runner_for(files["Q8_0"], quantization="gguf")
    tokens = prompts(runner.config.vocab_size, (23,), seed=3)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 23)])[0]
    diff = (ours - hf_logits(reference, tokens[0])).abs()
    assert diff.mean() < Q8_MEAN_ATOL, diff.mean()


@pytest.mark.parametrize("which", ["folder", "F32", "Q8_0"])
def test_llm_greedy_equals_transformers_generate(which, folder, files, reference):
    """A user's run: ``LLM`` on the folder or a GGUF file, a chat prompt in Gemma 3's template
    past the window; the prompt's tokens are the folder tokenizer's, the greedy ones
    transformers' ``generate``. Q8_0 too: transformers' top-2 margin is at least 0.23 at every
    step of this prompt, the Q8_0 file's logits differ from its by 0.06 on average (integer dot
    products, the same on every CPU level), so no step's choice is near a tie."""
    from transformers import AutoTokenizer

    from radixserve import LLM, SamplingParams

    path = folder if which == "folder" else files[which]
    llm = LLM(str(path), show_progress=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Why is the model so large? Give the reason."}],
        add_generation_prompt=True, tokenize=False)
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) > 8  # past the window
    with torch.inference_mode():
        want = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                  min_new_tokens=12)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()
    assert len(set(out.outputs[0].token_ids)) > 1  # not one token over and over


def test_image_tokens_are_the_same_ids_through_the_gguf_tokenizer(folder, files):
    """``<start_of_image>``, ``<image_soft_token>``, ``<end_of_image>`` are single special
    tokens with the config's ids through either tokenizer (what the prompt's image span is
    made of), and spelled back so."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    want = [config.boi_token_id, config.image_token_id, config.image_token_id,
            config.eoi_token_id]
    text = f"look:{BOI}{IMAGE_TOKEN}{IMAGE_TOKEN}{EOI} done"
    by_folder = load_tokenizer(ModelSource.resolve(str(folder)))
    by_file = load_tokenizer(ModelSource.resolve(str(files["Q8_0"])))
    ids = by_folder.encode(text, add_special_tokens=False)
    assert ids == by_file.encode(text, add_special_tokens=False)
    start = ids.index(config.boi_token_id)
    assert ids[start:start + 4] == want
    assert by_file.convert_ids_to_tokens(want) == [BOI, IMAGE_TOKEN, IMAGE_TOKEN, EOI]
