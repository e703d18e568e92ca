"""Models with sliding-window layers — Mistral (every layer windowed), Gemma 2 (soft-caps, every
other layer windowed), Gemma 3 (5 sliding : 1 global, two rope bases, q/k norms), Qwen2 with
``use_sliding_window`` (the layers from ``max_window_layers`` on) — against
transformers, through the paged cache: packed prefill, mixed steps of chunks and decodes
across the window's edge, a prefix-cache hit, block sizes that split the window inside a block,
both attention backends; and their GGUF files (names, norms stored as 1 + w, metadata)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch
from tiny_models import hf_to_gguf, load_gguf_model, make_hf_model
from transformers import AutoConfig, AutoModelForCausalLM

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.sched_output import ScheduledSeq
from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.source import ModelSource
from radixserve.runner.model_runner import ModelRunner

ATOL = 1e-4
WINDOWED = ("mistral", "gemma2", "gemma3")
BACKENDS = ["cpu_native", "torch"] if native.load() is not None else ["torch"]


@pytest.fixture(scope="module")
def windowed_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("windowed")
    return {arch: make_hf_model(arch, root / arch, seed=3) for arch in WINDOWED}


@pytest.fixture(scope="module")
def references(windowed_dirs):
    return {arch: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            for arch, d in windowed_dirs.items()}


def runner_for(path, backend="auto", block_size=4, quantization="none",
               num_blocks=96) -> ModelRunner:
    source = ModelSource.resolve(str(path))
    config = load_model_config(source)
    model = load_model(source, config, torch.device("cpu"), torch.float32, show_progress=False,
                       quantization=quantization)
    return ModelRunner(model, config, num_blocks, block_size, torch.device("cpu"),
                       torch.float32, attn_backend=backend)


class Paged:
    """Sequences on blocks drawn from a shuffled pool, fed chunk by chunk."""

    def __init__(self, tokens: list[list[int]], block_size: int, num_blocks: int = 96,
                 seed: int = 0) -> None:
        self.pool = BlockPool(num_blocks)
        random.Random(seed).shuffle(self.pool.free_queue)
        self.tokens, self.block_size = tokens, block_size
        self.computed = [0] * len(tokens)
        self.blocks: list[list[int]] = [[] for _ in tokens]

    def chunk(self, i: int, n: int) -> ScheduledSeq:
        start = self.computed[i]
        need = -(-(start + n) // self.block_size) - len(self.blocks[i])
        self.blocks[i] += self.pool.allocate(max(need, 0))
        self.computed[i] += n
        return ScheduledSeq(str(i), self.tokens[i][start:start + n], start, self.blocks[i],
                            sample=False)


def hf_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([token_ids])).logits[0].float()


def prompts(vocab: int, lengths, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def test_configs_say_which_layers_slide(windowed_dirs):
    configs = {a: load_model_config(ModelSource.resolve(str(d)))
               for a, d in windowed_dirs.items()}
    assert [configs["mistral"].layer_window(i) for i in range(2)] == [8, 8]
    assert [configs["gemma2"].layer_window(i) for i in range(2)] == [8, None]
    assert [configs["gemma3"].layer_window(i) for i in range(6)] == [8] * 5 + [None]
    g2, g3 = configs["gemma2"].gemma, configs["gemma3"].gemma
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping) == (5.0, 3.0)
    assert (g3.rope_local_theta, configs["gemma3"].rope_theta) == (10000.0, 100000.0)
    assert configs["gemma3"].qk_norm and not configs["gemma2"].qk_norm


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", WINDOWED)
def test_packed_prefill_matches_transformers(arch, backend, windowed_dirs, references):
    runner = runner_for(windowed_dirs[arch], backend)
    assert runner.backend_name == backend
    tokens = prompts(runner.config.vocab_size, (30, 5, 17, 9), seed=1)
    paged = Paged(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(references[arch], t), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch,block_size", [("mistral", 4), ("mistral", 16), ("gemma2", 5),
                                             ("gemma3", 4), ("gemma3", 16)])
def test_chunks_and_decodes_across_the_window_match_transformers(arch, block_size, backend,
                                                                 windowed_dirs, references):
    """Mixed batches: prefill chunks that start before the window's edge and end past it,
    short chunks (decode rows) and one-token decodes, at different paces per sequence."""
    runner = runner_for(windowed_dirs[arch], backend, block_size)
    tokens = prompts(runner.config.vocab_size, (30, 23, 14), seed=2)
    paged = Paged(tokens, block_size, seed=3)
    plan = [[(0, 6), (1, 1)], [(0, 7), (1, 10), (2, 1)], [(0, 1), (1, 1), (2, 6)],
            [(0, 3), (2, 1), (1, 11)], [(0, 13), (2, 6)]]
    for step in plan:
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(references[arch], tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)
    assert paged.computed == [len(t) for t in tokens]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_prefix_cache_hit_matches_transformers(arch, backend, windowed_dirs, references):
    """A second prompt reads the first one's whole leading blocks (12 tokens, past the
    window) as cached context and computes only its own tail, as after a radix-cache hit."""
    runner = runner_for(windowed_dirs[arch], backend)
    vocab = runner.config.vocab_size
    shared, tail_a, tail_b = prompts(vocab, (12, 7, 9), seed=5)
    paged = Paged([shared + tail_a], 4)
    runner.all_logits([paged.chunk(0, 19)])
    blocks = paged.blocks[0][:3] + paged.pool.allocate(3)
    seq = ScheduledSeq("hit", tail_b, 12, blocks, sample=False)
    (logits,) = runner.all_logits([seq])
    want = hf_logits(references[arch], shared + tail_b)[12:]
    torch.testing.assert_close(logits, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
@pytest.mark.parametrize("ftype", ["F32", "Q8_0"])
def test_gemma_gguf_matches_transformers_loading_it(arch, ftype, windowed_dirs, tmp_path):
    """Tensor names (post_attention_norm, ffn_norm = pre-MLP, post_ffw_norm, q/k norms), the
    norms stored as 1 + w, the window and soft-caps from the metadata, the sliding pattern
    llama.cpp assumes: against transformers' own loading of the same file."""
    path = hf_to_gguf(windowed_dirs[arch], tmp_path / f"{arch}.gguf", ftype)
    reference = load_gguf_model(path, AutoConfig.from_pretrained(windowed_dirs[arch]))
    hf_config = load_model_config(ModelSource.resolve(str(windowed_dirs[arch])))
    runner = runner_for(path)
    # the metadata means the same model as config.json (eps stored as float32)
    assert replace(runner.config, rms_norm_eps=hf_config.rms_norm_eps) == hf_config
    tokens = prompts(runner.config.vocab_size, (26, 11), seed=6)
    paged = Paged(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


@pytest.mark.skipif(native.load() is None, reason="blocks as stored need the native kernels")
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_quantized_gguf_runs_as_stored_close_to_its_float_weights(arch, windowed_dirs,
                                                                  tmp_path):
    """Q4_K_M files in the default mode (blocks as stored, 8-bit activations), Gemma's extra
    norms and q/k norms loaded beside the block matrices: close to the same file dequantized
    (the float path), chunked prefill then decodes."""
    path = hf_to_gguf(windowed_dirs[arch], tmp_path / f"{arch}.gguf", "Q4_K_M")
    stored, floats = runner_for(path, quantization="gguf"), runner_for(path)
    layer = stored.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, BlockLinear)
    assert isinstance(stored.model.lm_head if arch == "gemma3" else layer.mlp.down_proj,
                      BlockLinear)
    tokens = prompts(stored.config.vocab_size, (20, 9), seed=7)
    paged = {"stored": Paged(tokens, 4), "float": Paged(tokens, 4)}
    for step in ([(0, 12), (1, 5)], [(0, 7), (1, 1)], [(0, 1), (1, 3)]):
        a = stored.all_logits([paged["stored"].chunk(i, n) for i, n in step])
        b = floats.all_logits([paged["float"].chunk(i, n) for i, n in step])
        for x, y in zip(a, b):
            log_p, log_q = torch.log_softmax(y, -1), torch.log_softmax(x, -1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            assert kl.max() < 0.01, kl  # measured: at most 0.0015


@pytest.mark.skipif(native.load() is None, reason="the native layer stack needs the kernels")
@pytest.mark.usefixtures("kernel_level")
def test_mistral_native_layer_stack_applies_the_window(windowed_dirs, tmp_path):
    """Mistral runs one native call per layer (decoder_layer.cpp) with the window: the same
    bits as its Python layers, which match transformers above (Gemma: test_gemma_native_stack)."""
    from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack

    path = hf_to_gguf(windowed_dirs["mistral"], tmp_path / "m.gguf", "Q8_0")
    runner = runner_for(path, quantization="gguf")
    tokens = prompts(runner.config.vocab_size, (26, 12), seed=8)

    def steps():
        paged, out = Paged(tokens, 4), []
        for step in ([(0, 14), (1, 5)], [(0, 11), (1, 6)], [(0, 1), (1, 1)]):
            out += runner.all_logits([paged.chunk(i, n) for i, n in step])
        return out

    native_out = steps()
    assert isinstance(runner.model._stack, NativeLayerStack)
    runner.model._stack = PythonLayerStack(runner.model.layers)
    for a, b in zip(native_out, steps()):
        assert torch.equal(a, b)


def _with_config(src, dst, **changes):
    import json
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("changes,match", [
    ({"architectures": ["Gemma3ForConditionalGeneration"],
      "text_config": {"model_type": "gemma3n_text"}},
     "unsupported Gemma 3 text model 'gemma3n_text'.*gemma3_text"),
    ({"architectures": ["GemmaForCausalLM"]},
     "unsupported model architecture 'GemmaForCausalLM'.*Gemma2ForCausalLM.*Gemma3ForCausalLM"),
    ({"layer_types": ["sliding_attention", "chunked_attention"] + ["full_attention"] * 4},
     "unsupported Gemma layer_types.*chunked_attention"),
    ({"hidden_activation": "relu"}, "unsupported Gemma activation 'relu'.*gelu_pytorch_tanh"),
])
def test_bad_gemma_configs_name_what_is_supported(changes, match, windowed_dirs, tmp_path):
    folder = _with_config(windowed_dirs["gemma3"], tmp_path / "bad", **changes)
    with pytest.raises(ValueError, match=match):
        load_model_config(ModelSource.resolve(str(folder)))


def test_unsupported_gguf_architecture_names_gemma(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "gemma9.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma9")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError,
                       match="unsupported GGUF architecture 'gemma9'.*gemma2.*gemma3.*gemma4"):
        load_model_config(ModelSource.resolve(str(path)))


def test_qwen2_window_applies_from_max_window_layers(tmp_path):
    """Qwen2's ``use_sliding_window``: the window on the layers from ``max_window_layers`` on
    (transformers' rule; config.json also carries them as ``layer_types``, read first), none
    without it; then chunks and decodes across the window's edge against transformers."""
    path = make_hf_model("qwen2", tmp_path / "swa", seed=3, use_sliding_window=True,
                         sliding_window=8, max_window_layers=1)
    config = load_model_config(ModelSource.resolve(str(path)))
    assert [config.layer_window(i) for i in range(2)] == [None, 8]
    cfg = json.loads((path / "config.json").read_text())
    for folder, edit, want in (("rule", {"layer_types": None}, [None, 8]),
                               ("off", {"use_sliding_window": False}, [None, None]),
                               ("types", {"layer_types": ["sliding_attention"] * 2}, [8, 8])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps({**cfg, **edit}))
        got = load_model_config(ModelSource("hf", str(tmp_path / folder), folder))
        assert [got.layer_window(i) for i in range(2)] == want, folder
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runner = runner_for(path, block_size=4)
    tokens = prompts(runner.config.vocab_size, (30, 14), seed=2)
    paged = Paged(tokens, 4, seed=3)
    for step in ([(0, 6), (1, 1)], [(0, 7), (1, 10)], [(0, 1), (1, 1)], [(0, 16), (1, 2)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), seq, logits in zip(step, seqs, runner.all_logits(seqs)):
            full = hf_logits(reference, tokens[i][:seq.context_len])
            torch.testing.assert_close(logits, full[seq.start_pos:], atol=ATOL, rtol=0)
    # the window matters here: the full-attention model of the same weights differs
    full_model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, layer_types=["full_attention"] * 2).eval()
    assert not torch.allclose(hf_logits(full_model, tokens[0])[-1],
                              hf_logits(reference, tokens[0])[-1], atol=ATOL)
