"""Qwen2.5-VL's text model (models/qwen2_vl_config.py): a Qwen2 decoder with mRoPE, read from a
``Qwen2_5_VLForConditionalGeneration`` folder (releases' flat config and ``model.*``;
transformers 5's ``text_config`` and ``model.language_model.*``) and from the converter's
``qwen2vl`` GGUF; ``ModelConfig.mrope`` set from either; on text its logits equal
transformers' (mRoPE over equal positions is plain rope); the vision tower is never read."""

from __future__ import annotations

import pytest
import safetensors
import tiny_qwen25_vl as tiny
import torch
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from transformers import Qwen2_5_VLForConditionalGeneration

from radixserve.kernels import native
from radixserve.model_config import MRopeParams
from radixserve.models.loader import load_model_config
from radixserve.models.qwen2_vl_config import qwen2_vl_hf_config
from radixserve.models.source import ModelSource

ATOL = 1e-4
ARCH = "Qwen2_5_VLForConditionalGeneration"
MROPE = MRopeParams((2, 3, 3), interleaved=False)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl-text")
    return {"release": tiny.make_qwen25_vl_hf(root / "release", seed=4),
            "transformers": tiny.make_qwen25_vl_hf(root / "t5", seed=4, layout="transformers"),
            "tied": tiny.make_qwen25_vl_hf(root / "tied", seed=5, tie_word_embeddings=True)}


@pytest.fixture(scope="module")
def references(folders):
    return {name: Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32).eval() for name, path in folders.items()}


@pytest.fixture(scope="module")
def text_files(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl-gguf")
    files = {ftype: tiny.qwen25_vl_text_gguf(folders["release"], root / f"{ftype}.gguf", ftype)
             for ftype in ("F32", "Q8_0")}
    files["tied"] = tiny.qwen25_vl_text_gguf(folders["tied"], root / "tied.gguf", "F32")
    return files


@pytest.mark.parametrize("which", ["release", "transformers", "tied"])
def test_folder_config_has_the_mrope_sections(which, folders):
    config = load_model_config(ModelSource.resolve(str(folders[which])))
    assert config.architecture == ARCH and config.mrope == MROPE
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim) == (2, 64, 4, 2, 16)
    assert config.attention_bias and config.rope_theta == 1_000_000.0
    assert config.rope_scaling is None and config.vocab_size == 389
    assert config.tie_word_embeddings == (which == "tied")


@pytest.mark.parametrize("which", ["F32", "tied"])
def test_gguf_config_says_the_same(which, folders, text_files):
    hf = load_model_config(ModelSource.resolve(str(
        folders["tied" if which == "tied" else "release"])))
    gg = load_model_config(ModelSource.resolve(str(text_files[which])))
    assert gg.architecture == ARCH and gg.mrope == MROPE
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size", "rope_theta", "attention_bias", "tie_word_embeddings",
                  "intermediate_size", "rope_scaling"):
        assert getattr(gg, field) == getattr(hf, field), field
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)  # a float32 in the file


def test_configs_refused():
    base = {"architectures": [ARCH], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10}
    ok = qwen2_vl_hf_config({**base, "rope_scaling": {"type": "mrope",
                                                      "mrope_section": [2, 3, 3, 0]}}, ARCH)
    assert ok.mrope == MROPE and ok.rope_theta == 1_000_000.0  # transformers' default theta
    later = {"type": "default", "rope_type": "default", "mrope_section": [2, 3, 3]}
    assert qwen2_vl_hf_config({**base, "rope_scaling": later}, ARCH).mrope == MROPE
    for cfg, match in (
            ({**base, "rope_scaling": {"type": "yarn", "factor": 2.0}}, "rope type 'yarn'"),
            ({**base}, "needs rope_scaling.mrope_section"),
            ({**base, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3]}},
             "must sum to half the head"),
            ({**base, "use_sliding_window": True,
              "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
             "use_sliding_window")):
        with pytest.raises(ValueError, match=match):
            qwen2_vl_hf_config(cfg, ARCH)


@pytest.mark.parametrize("which", ["release", "transformers", "tied"])
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
    want = hf_logits(references["tied" if which == "tied" else "release"], tokens[0])
    torch.testing.assert_close(ours, want, atol=ATOL, rtol=0)


def test_gguf_q8_0_as_stored_is_close_to_transformers(text_files, references):
    runner = runner_for(text_files["Q8_0"], quantization="gguf" if native.load() else "none")
    tokens = prompts(runner.config.vocab_size, (23,), seed=3)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 23)])[0]
    diff = (ours - hf_logits(references["release"], tokens[0])).abs()
    assert diff.mean() < 0.15, diff.mean()  # a wrong name or rope is off by the logits' std


@pytest.mark.parametrize("which", ["folder", "F32"])
def test_llm_greedy_equals_transformers_generate(which, folders, text_files, references):
    """A user's run: ``LLM`` on the folder or the text GGUF, a chat prompt in the release's
    template; the greedy tokens are transformers' ``generate``."""
    from transformers import AutoTokenizer

    from radixserve import LLM, SamplingParams

    path = folders["release"] if which == "folder" else text_files[which]
    llm = LLM(str(path), show_progress=False)
    tokenizer = AutoTokenizer.from_pretrained(folders["release"])
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]}],
        add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        want = references["release"].generate(torch.tensor([ids]), max_new_tokens=10,
                                               do_sample=False, min_new_tokens=10)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()
    assert len(set(out.outputs[0].token_ids)) > 1  # not one token over and over
