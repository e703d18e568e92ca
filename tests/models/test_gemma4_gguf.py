"""Gemma 4 ``gemma4`` GGUF files (what llama.cpp's converter writes, tests/tiny_gemma4_gguf.py)
of the three tiny layouts: the config read from the metadata = the folder's; an F32 file's
logits = transformers' float32 ones (every name and value transform undone); a Q8_0 file as
stored (quantized matrices, the token and per-layer tables kept as stored rows) close to them
and exactly invariant to its batch and chunking."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from test_gemma4 import Paged, hf_logits, runner_for
from tiny_gemma4 import KINDS, make_gemma4_hf_model
from tiny_gemma4_gguf import gemma4_hf_to_gguf, save_byte_fallback_tokenizer
from transformers import AutoModelForCausalLM

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.gemma4_gguf import gemma4_gguf_name
from radixserve.models.gguf_stored import StoredEmbedding, memory_plan
from radixserve.models.loader import load_model_config
from radixserve.models.source import ModelSource

ATOL = 1e-4
# Q8_0 as stored rounds weights and activations to 8 bits (logits' std about 2): a mean
# absolute difference under this; a wrong norm, name or rope is off by about the std
Q8_MEAN_ATOL = 0.15
# 32 dims a layer: the per-layer table's rows and the projection's split into Q8_0 blocks
OVERRIDES = {"e2b": {"hidden_size_per_layer_input": 32}}
needs_native = pytest.mark.skipif(native.load() is None, reason="GGUF as stored needs the "
                                  "native kernels")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-gguf")
    return {kind: save_byte_fallback_tokenizer(
        make_gemma4_hf_model(kind, root / kind, seed=7, **OVERRIDES.get(kind, {})))
        for kind in KINDS}


@pytest.fixture(scope="module")
def references(folders):
    return {kind: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                       attn_implementation="eager").eval()
            for kind, d in folders.items()}


@pytest.fixture(scope="module")
def files(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-files")
    return {(kind, ftype): gemma4_hf_to_gguf(d, root / f"{kind}-{ftype}.gguf", ftype)
            for kind, d in folders.items() for ftype in ("F32", "Q8_0")}


def _prompts(vocab: int, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("kind", KINDS)
def test_config_from_gguf_equals_config_from_folder(folders, files, kind):
    hf = load_model_config(ModelSource.resolve(str(folders[kind])))
    gg = load_model_config(ModelSource.resolve(str(files[kind, "Q8_0"])))
    assert gg.rms_norm_eps == pytest.approx(hf.rms_norm_eps)  # stored as float32
    assert dataclasses.replace(gg, rms_norm_eps=hf.rms_norm_eps) == hf


@pytest.mark.parametrize("kind", KINDS)
def test_f32_file_logits_equal_transformers(files, references, kind):
    """The float path: packed prefills of two sequences past the window, then chunks and
    decodes mixed in steps."""
    runner = runner_for(files[kind, "F32"])
    tokens = _prompts(runner.config.vocab_size, (19, 13), seed=1)
    paged = Paged(tokens, 4)
    got: list[list[torch.Tensor]] = [[], []]
    for step in ([(0, 9), (1, 8)], [(0, 6), (1, 1)], [(0, 1), (1, 4)], [(0, 3)]):
        seqs = [paged.chunk(i, n) for i, n in step]
        for (i, _), logits in zip(step, runner.all_logits(seqs)):
            got[i].append(logits)
    for i, toks in enumerate(tokens):
        want = hf_logits(references[kind], toks)
        torch.testing.assert_close(torch.cat(got[i]), want, atol=ATOL, rtol=0)


@needs_native
@pytest.mark.parametrize("kind", KINDS)
def test_q8_file_as_stored_is_close_and_batch_invariant(files, references, kind):
    """Every layout close to float32, and (every matrix a native block linear, the 26B's
    experts too) the same logits whatever the batch and the chunking."""
    runner = runner_for(files[kind, "Q8_0"], quantization="gguf")
    model = runner.model
    if kind == "e2b":  # the per-layer table stays the file's Q8_0 rows, looked up by row
        table = model.embed_tokens_per_layer
        assert isinstance(table, StoredEmbedding) and table.qtype == GGMLQuantizationType.Q8_0
        assert table.rows.dtype == torch.uint8 and table.embedding_dim == 6 * 32
    tokens = _prompts(runner.config.vocab_size, (23, 9, 14), seed=3)
    whole = runner.all_logits([Paged(tokens, 4).chunk(0, 23)])[0]
    diff = (whole - hf_logits(references[kind], tokens[0])).abs()
    assert diff.mean() < Q8_MEAN_ATOL, (kind, diff.mean())
    alone = Paged(tokens, 4)
    pieces = [runner.all_logits([alone.chunk(0, n)])[0] for n in (1, 7, 3, 12)]
    assert torch.equal(torch.cat(pieces), whole)
    batched = Paged(tokens, 4)
    first = runner.all_logits([batched.chunk(1, 9), batched.chunk(0, 10), batched.chunk(2, 14)])
    second = runner.all_logits([batched.chunk(0, 13)])
    assert torch.equal(torch.cat([first[1], second[0]]), whole)


@needs_native
def test_26b_file_as_stored_holds_each_expert_as_its_blocks(files):
    """The 26B layout's Q8_0 file as stored: each layer's 4 experts two block linears on the
    file's Q8_0 rows (no float copy), the router and its scales as the float path has them, and
    the memory plan from the tensor table = the packed bytes held."""
    path = files["26b", "Q8_0"]
    model = runner_for(path, quantization="gguf").model
    for layer in model.layers:
        assert len(layer.experts) == 4
        for expert in layer.experts:
            for linear in (expert.gate_up_proj, expert.down_proj):
                assert isinstance(linear, BlockLinear), type(linear)
                assert linear.types == ("Q8_0",)
            assert expert.gate_up_proj.out_features == 2 * expert.down_proj.in_features == 64
        assert layer.router.per_expert_scale.shape == (4,)
    assert not any(p.dim() == 3 for p in model.parameters())
    reader = GGUFReader(str(path))
    plan = memory_plan((t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
                       for t in reader.tensors)
    packed = sum(b.numel() for m in model.modules() if isinstance(m, BlockLinear)
                 for name, b in m.named_buffers() if name.startswith("packed"))
    assert plan.weights == packed


def test_llm_on_the_file_greedy_equals_transformers_generate(folders, files, references):
    """A user's run: ``LLM`` on the F32 E2B file (its ``gemma4`` vocabulary, the engine's
    scheduler and cache): the prompt's tokens are the folder tokenizer's, and the greedy
    tokens past the window are transformers' ``generate``."""
    from transformers import AutoTokenizer

    from radixserve import LLM, SamplingParams

    llm = LLM(str(files["e2b", "F32"]), show_progress=False)
    prompt = "the quick brown fox jumps over the lazy dog and the cache"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert ids == AutoTokenizer.from_pretrained(folders["e2b"])(prompt)["input_ids"]
    assert len(ids) > 8  # past the window
    with torch.inference_mode():
        want = references["e2b"].generate(torch.tensor([ids]), max_new_tokens=10,
                                          do_sample=False, min_new_tokens=10)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()


def test_memory_plan_counts_the_per_layer_table_as_a_lookup_table(files):
    reader = GGUFReader(str(files["e2b", "Q8_0"]))
    tensors = [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
               for t in reader.tensors]
    table = next(t for t in reader.tensors if t.name == "per_layer_token_embd.weight")
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    plan = memory_plan(tensors)
    # tied head: the token table lives in the packed head; the per-layer one is its own
    assert plan.embedding == int(table.n_bytes)
    assert plan.weights > int(embed.n_bytes)


def test_gguf_names():
    assert gemma4_gguf_name("blk.3.layer_output_scale.weight") == "layers.3.layer_scalar"
    assert gemma4_gguf_name("blk.0.ffn_gate_inp.scale") == "layers.0.router.scale"
    assert gemma4_gguf_name("blk.0.ffn_down_exps.scale") == "layers.0.router.per_expert_scale"
    assert (gemma4_gguf_name("blk.2.ffn_gate_up_exps.weight")
            == "layers.2.experts.*.gate_up_proj.weight")  # cut per expert by the loaders
    assert gemma4_gguf_name("blk.2.ffn_down_exps.weight") == "layers.2.experts.*.down_proj.weight"
    assert gemma4_gguf_name("blk.1.ffn_norm.weight") == "layers.1.pre_feedforward_layernorm.weight"
    assert gemma4_gguf_name("per_layer_token_embd.weight") == "embed_tokens_per_layer.weight"
    for skipped in ("rope_freqs.weight", "v.blk.0.attn_q.weight", "mm.input_projection.weight"):
        assert gemma4_gguf_name(skipped) is None
    for bad in ("blk.0.altup_router.weight", "blk.0.attn_q", "laurel.weight"):
        with pytest.raises(ValueError, match="unexpected GGUF tensor"):
            gemma4_gguf_name(bad)


def _meta(**over) -> dict:
    base = {"block_count": 4, "embedding_length": 16, "feed_forward_length": 32,
            "attention.head_count": 4, "attention.head_count_kv": 2,
            "attention.key_length": 16, "attention.key_length_swa": 8,
            "attention.sliding_window_pattern": [True, False, True, False],
            "attention.shared_kv_layers": 0, "vocab_size": 40}
    return {f"gemma4.{k}": v for k, v in {**base, **over}.items()}


def _config_of(meta: dict, rope_freqs: list[float] | None = None):
    from types import SimpleNamespace

    from radixserve.models.gemma4_gguf import gemma4_gguf_config

    tensors = [SimpleNamespace(name="token_embd.weight", shape=(16, 40), data=None)]
    if rope_freqs is not None:
        tensors.append(SimpleNamespace(name="rope_freqs.weight", shape=(len(rope_freqs),),
                                       data=rope_freqs))
    reader = SimpleNamespace(tensors=tensors, fields={})
    return gemma4_gguf_config(reader, lambda r, key, default=None: meta.get(key, default),
                              "gemma4", "Gemma4ForCausalLM")


def test_config_reads_release_metadata_and_rejects_what_does_not_run():
    """The 31B's metadata (one global KV head, 1e30 on the unrotated pairs); files whose
    metadata this model cannot run: ValueError naming what."""
    cfg = _config_of(_meta(**{"attention.head_count_kv": [2, 1, 2, 1]}),
                     [1.0, 1.0] + [1e30] * 6)
    assert cfg.kv_shapes == ((2, 8), (1, 16), (2, 8), (1, 16)) and cfg.num_kv_heads == 2
    assert cfg.gemma4.global_rope_fraction == 0.25 and cfg.gemma4.k_eq_v_layers == (1, 3)
    assert _config_of(_meta()).gemma4.global_rope_fraction == 1.0  # no rope_freqs
    cases = [
        (_meta(**{"attention.sliding_window_pattern": None}), None, "sliding_window_pattern"),
        (_meta(**{"attention.sliding_window_pattern": [True, False]}), None, "2 entries"),
        (_meta(feed_forward_length=[32, 32, 64, 32]), None, "feed_forward_length"),
        (_meta(**{"attention.head_count_kv": 3}), None, "query heads"),
        (_meta(), [1.0, 1e30, 1.0] + [1e30] * 5, "rope_freqs"),
        (_meta(), [1.0] * 4, "4 entries"),
        (_meta(expert_count=4, expert_used_count=5), None, "expert_used_count"),
        (_meta(embedding_length_per_layer_input=8), None, "per_layer_token_embd"),
    ]
    for meta, freqs, match in cases:
        with pytest.raises(ValueError, match=match):
            _config_of(meta, freqs)
