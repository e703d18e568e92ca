"""SmolLM3 (NoPE layers), OLMo 2 (norms after attention and the MLP, whole-width q/k norms),
OLMo 3 (+ sliding layers with their own plain rope, yarn on the full ones) and Ministral 3's
text model (yarn, Llama 4's query temperature from position 16 on, in a vision + text folder)
against transformers in float32: the shape from config.json and from the GGUF file llama.cpp's
converter writes (tiny_families60.py) are the same; packed prefill, chunks and decodes through
the paged cache, from the folder and from the F32 file; the Q8_0 file against transformers
holding the same Q8_0 weights, dequantized and as stored; the native layer stacks of SmolLM3
(NoPE layers as identity tables) and Ministral 3 (Python layers for tempered steps) bit-equal
to their Python layers; greedy generation through ``LLM``."""

from __future__ import annotations

import dataclasses
import json
import shutil

import gguf
import pytest
import torch
from kquants import quantize
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from tiny_families60 import KINDS, family_hf_to_gguf, make_family_hf_model
from transformers import AutoModelForCausalLM, Mistral3ForConditionalGeneration

from radixserve.kernels import native
from radixserve.model_config import LayerRope
from radixserve.models.loader import load_model_config
from radixserve.models.mistral3_config import mistral3_hf_name
from radixserve.models.native_stack import ONE_CALL, NativeLayerStack, PythonLayerStack
from radixserve.models.source import ModelSource

ATOL = 1e-4
BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]
needs_native = pytest.mark.skipif(native.load() is None, reason="needs the native kernels")
# (sequence, tokens) per step: chunks that start before the OLMo 3 window's edge (8) and end
# past it, one-token decodes, at different paces per sequence
PLAN = ([(0, 6), (1, 1)], [(0, 7), (1, 10), (2, 1)], [(0, 1), (1, 1), (2, 6)],
        [(0, 3), (2, 1), (1, 11)], [(0, 13), (2, 6)])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families60")
    return {kind: make_family_hf_model(kind, root / kind, seed=3) for kind in KINDS}


def load_reference(kind: str, folder):
    cls = Mistral3ForConditionalGeneration if kind == "mistral3" else AutoModelForCausalLM
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def references(folders):
    return {kind: load_reference(kind, d) for kind, d in folders.items()}


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def run_plan(runner, reference, tokens, block_size=4):
    """Feed ``tokens`` by ``PLAN`` and compare every step's logits with transformers' over the
    whole context."""
    paged = Paged(tokens, block_size, seed=3)
    for step in PLAN:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)
    assert paged.computed == [len(t) for t in tokens]


@pytest.mark.parametrize("kind", KINDS)
def test_config_json_and_gguf_say_the_same_model(kind, folders, tmp_path):
    hf = config_of(folders[kind])
    gg = config_of(family_hf_to_gguf(folders[kind], tmp_path / f"{kind}.gguf"))
    # floats stored as float32: eps, Ministral 3's temperature
    assert dataclasses.replace(gg, rms_norm_eps=hf.rms_norm_eps,
                               rope_scaling=hf.rope_scaling) == hf
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    if hf.rope_scaling is not None:
        assert gg.rope_scaling.keys() == hf.rope_scaling.keys()
        for key, value in hf.rope_scaling.items():
            assert gg.rope_scaling[key] == (value if isinstance(value, str)
                                            else pytest.approx(value)), key
    if kind == "smollm3":
        assert hf.layer_rope == LayerRope(no_rope=(3,)) and hf.tie_word_embeddings
    elif kind == "olmo2":
        assert (hf.architecture, hf.layer_rope, hf.sliding_window) == ("Olmo2ForCausalLM", None,
                                                                        None)
    elif kind == "olmo3":
        assert hf.architecture == "Olmo3ForCausalLM"
        assert [hf.layer_window(i) for i in range(4)] == [8, 8, 8, None]
        assert hf.layer_rope == LayerRope(sliding_theta=5000.0)
        assert hf.rope_theta == 10000.0 and hf.rope_scaling["rope_type"] == "yarn"
    else:  # the text model of a vision + text folder
        assert hf.architecture == "Mistral3ForConditionalGeneration"
        assert hf.rope_scaling["llama_4_scaling_beta"] == 0.1
        assert hf.rope_scaling["original_max_position_embeddings"] == 16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_folder_prefill_chunks_and_decodes_match_transformers(kind, backend, folders,
                                                              references):
    runner = runner_for(folders[kind], backend)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    run_plan(runner, references[kind], tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_f32_gguf_matches_transformers(kind, folders, references, tmp_path):
    runner = runner_for(family_hf_to_gguf(folders[kind], tmp_path / "f32.gguf"), block_size=5)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=4)
    run_plan(runner, references[kind], tokens, block_size=5)


def q8_reference(kind, folder):
    """transformers' model of ``folder`` with every text matrix as the Q8_0 file holds it (a
    row permutation does not change a row's blocks, so permuted Q/K round-trip alike)."""
    model = load_reference(kind, folder)
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and mistral3_hf_name(name) is not None:
                stored = quantize(param.numpy(), q8)
                param.copy_(torch.from_numpy(gguf.quants.dequantize(stored, q8)))
    return model


@needs_native
@pytest.mark.parametrize("kind", KINDS)
def test_q8_0_gguf_as_stored_matches_transformers_on_its_weights(kind, folders, tmp_path):
    """Transformers holding the file's Q8_0 weights in float32: the file dequantized gives its
    logits, the file's blocks as stored (8-bit activations in the linears) close distributions
    and its greedy token wherever its top-2 margin is clear. SmolLM3 runs one native call per
    layer (its NoPE layers rotate by identity tables), Ministral 3 too for steps below
    position 16 (the Python layers past it): bit-equal to their Python layers."""
    path = family_hf_to_gguf(folders[kind], tmp_path / "q8.gguf", "Q8_0")
    reference = q8_reference(kind, folders[kind])
    tokens = prompts(config_of(path).vocab_size, (26, 12), seed=8)
    dequantized = runner_for(path)  # the file's values in float32: transformers' to rounding
    paged = Paged(tokens, 4)
    for t, logits in zip(tokens, dequantized.all_logits(
            [paged.chunk(i, len(t)) for i, t in enumerate(tokens)])):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)
    runner = runner_for(path, quantization="gguf")

    def steps():
        paged, out = Paged(tokens, 4), []
        for step in ([(0, 14), (1, 5)], [(0, 11), (1, 6)], [(0, 1), (1, 1)]):
            out += runner.all_logits([paged.chunk(i, n) for i, n in step])
        return out

    ours = steps()
    got = [torch.cat(ours[0::2]), torch.cat(ours[1::2])]
    for t, logits in zip(tokens, got):
        want = hf_logits(reference, t)
        log_p, log_q = torch.log_softmax(want, -1), torch.log_softmax(logits, -1)
        assert (log_p.exp() * (log_p - log_q)).sum(-1).max() < 0.01  # measured 0.002
        top2 = want.topk(2).values
        clear = top2[:, 0] - top2[:, 1] > 0.2  # where 8-bit rounding cannot flip the choice
        assert torch.equal(logits.argmax(-1)[clear], want.argmax(-1)[clear])
    stack = runner.model._stack
    if kind not in ("smollm3", "mistral3"):
        assert isinstance(stack, PythonLayerStack)
        assert "OLMo's norms" in runner.model.kernel_plan.decoder_layers
        return
    assert isinstance(stack, NativeLayerStack)
    assert runner.model.kernel_plan.decoder_layers == ONE_CALL
    runner.model._stack = PythonLayerStack(runner.model.layers)
    for a, b in zip(ours, steps()):
        assert torch.equal(a, b)


def test_llm_greedy_equals_transformers_generate(folders, references):
    """OLMo 3 through the engine (scheduler, radix cache, sliding-window KV groups): greedy
    tokens past the window = transformers' ``generate``."""
    from radixserve import LLM, SamplingParams

    llm = LLM(str(folders["olmo3"]), show_progress=False)
    prompt = "the quick brown fox jumps over the lazy dog and the cache"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert len(ids) > 8  # past the window
    with torch.inference_mode():
        want = references["olmo3"].generate(torch.tensor([ids]), max_new_tokens=12,
                                            do_sample=False, min_new_tokens=12)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()


def test_mistral3_folder_names_map_to_the_text_model():
    """transformers 5 names (``model.language_model.*``) and 4 (``language_model.model.*``,
    ``language_model.lm_head``) both; the vision tower and the projector skipped."""
    assert mistral3_hf_name("model.language_model.layers.0.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert mistral3_hf_name("language_model.model.norm.weight") == "model.norm.weight"
    assert mistral3_hf_name("language_model.lm_head.weight") == "lm_head.weight"
    assert mistral3_hf_name("lm_head.weight") == "lm_head.weight"
    for name in ("model.vision_tower.ln_pre.weight", "vision_tower.patch_conv.weight",
                 "multi_modal_projector.linear_1.weight"):
        assert mistral3_hf_name(name) is None


@pytest.mark.parametrize("kind,changes,match", [
    ("smollm3", {"attention_bias": True}, "SmolLM3 with attention_bias is not supported"),
    ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for 4 layers"),
    ("olmo3", {"layer_types": ["sliding_attention", "chunked_attention"] * 2},
     "unsupported layer_types.*chunked_attention"),
    ("olmo2", {"hidden_act": "gelu"}, "unsupported activation 'gelu'.*silu"),
    ("mistral3", {"text_config": {"model_type": "llama"}},
     "unsupported Mistral 3 text model 'llama'.*ministral3"),
])
def test_bad_configs_say_what_is_supported(kind, changes, match, folders, tmp_path):
    shutil.copytree(folders[kind], tmp_path / "bad")
    path = tmp_path / "bad" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(ValueError, match=match):
        config_of(tmp_path / "bad")
