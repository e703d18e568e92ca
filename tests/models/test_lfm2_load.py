"""LFM2 / LFM2-MoE checkpoints load as transformers holds them: the shape from config.json (its
older keys too) and from the GGUF file llama.cpp's converter writes are the same, both files'
tensors fill the model with the same values, and what radixserve does not run fails at load
naming the reason."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from tiny_lfm2 import lfm2_hf_to_gguf, make_lfm2_hf_model, make_lfm2_moe_hf_model

from radixserve.model_config import FULL, LINEAR
from radixserve.models.lfm2_config import (
    lfm2_gguf_config,
    lfm2_gguf_name,
    lfm2_hf_config,
    lfm2_hf_name,
)
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.source import ModelSource

CONV_TYPES = (LINEAR, LINEAR, FULL, LINEAR, FULL)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lfm2_load")
    return {"tied": make_lfm2_hf_model(root / "tied", seed=0),
            "untied": make_lfm2_hf_model(root / "untied", seed=1, tie_word_embeddings=False),
            "moe": make_lfm2_moe_hf_model(root / "moe", seed=2)}


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def state_of(path) -> dict[str, torch.Tensor]:
    source = ModelSource.resolve(str(path))
    model = load_model(source, config_of(path), torch.device("cpu"), torch.float32,
                       show_progress=False)
    return model.state_dict()


def assert_same_config(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x == (pytest.approx(y, rel=1e-6) if isinstance(y, float) else y), f.name


def test_hf_config_reads_the_hybrid_shape(folders):
    config = config_of(folders["tied"])
    sc = config.linear_attn
    assert config.architecture == "Lfm2ForCausalLM" and config.moe is None
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim) == (5, 64, 4, 2, 16)
    assert config.intermediate_size == 160  # 2/3 of 200 = 133, rounded up to 32s
    assert config.rope_theta == 1e6 and config.rope_scaling is None and config.qk_norm
    assert config.tie_word_embeddings and config.rms_norm_eps == 1e-5
    assert sc.layer_types == CONV_TYPES and (sc.conv_dim, sc.conv_kernel) == (64, 3)
    assert sc.conv_state_shape == (2, 64) and sc.ssm_state_shape is None


def test_moe_config_routes_by_sigmoid_with_the_expert_bias(folders):
    moe = config_of(folders["moe"]).moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.dense_layers) == (8, 2, 32,
                                                                                     (0,))
    assert (moe.scoring, moe.expert_bias, moe.routed_scaling, moe.norm_topk_prob) == (
        "sigmoid", True, 1.0, True)
    assert config_of(folders["moe"]).intermediate_size == 96  # the dense layer's, as it is
    cfg = dict(_config_json(folders["moe"]), use_expert_bias=False, routed_scaling_factor=2.5,
               num_dense_layers=3)
    moe = lfm2_hf_config(cfg, "Lfm2MoeForCausalLM").moe
    assert (moe.expert_bias, moe.routed_scaling, moe.dense_layers) == (False, 2.5, (0, 1, 2))


@pytest.mark.parametrize("kind, ftype", [("tied", "F32"), ("untied", "F16"), ("moe", "Q8_0")])
def test_gguf_config_equals_hf_config(folders, kind, ftype, tmp_path):
    gguf = lfm2_hf_to_gguf(folders[kind], tmp_path / "m.gguf", ftype)
    assert_same_config(config_of(gguf), config_of(folders[kind]))


@pytest.mark.parametrize("kind", ["untied", "moe"])
def test_gguf_and_folder_fill_the_model_alike(folders, kind, tmp_path):
    """Every parameter from an F32 file (conv kernels [hidden, K], 3-D experts, the expert
    bias as ``exp_probs_b``, ``token_embd_norm`` the final norm) equals the folder's."""
    gguf = lfm2_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    ours, hf = state_of(gguf), state_of(folders[kind])
    assert sorted(ours) == sorted(hf)
    for name, t in hf.items():
        assert torch.equal(ours[name], t), name


def _config_json(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_older_config_keys_read_as_transformers_reads_them(folders):
    """LFM2-1.2B's config.json: ``block_ff_dim``, ``tie_embedding``, a top-level
    ``rope_theta``; no ``layer_types``: ``full_attn_idxs`` says which layers attend."""
    cfg = {k: v for k, v in _config_json(folders["untied"]).items()
           if k not in ("layer_types", "rope_parameters", "intermediate_size")}
    cfg.update(block_ff_dim=200, tie_embedding=True, rope_theta=5e5, full_attn_idxs=[1, 4])
    config = lfm2_hf_config(cfg, "Lfm2ForCausalLM")
    assert config.intermediate_size == 160 and config.tie_word_embeddings
    assert config.rope_theta == 5e5
    assert config.linear_attn.layer_types == (LINEAR, FULL, LINEAR, LINEAR, FULL)
    del cfg["full_attn_idxs"]  # transformers' default: every layer attends
    assert lfm2_hf_config(cfg, "Lfm2ForCausalLM").linear_attn.layer_types == (FULL,) * 5
    cfg.update(block_auto_adjust_ff_dim=False)
    assert lfm2_hf_config(cfg, "Lfm2ForCausalLM").intermediate_size == 200


@pytest.mark.parametrize("change, message", [
    ({"conv_bias": True}, "conv_bias"),
    ({"layer_types": ["conv", "full_attention"]}, "2 entries for 5 layers"),
    ({"layer_types": ["conv", "mamba", "conv", "conv", "conv"]}, "unknown LFM2 layer types"),
    ({"num_attention_heads": None, "hidden_size": None}, "lacks"),
])
def test_unsupported_configs_fail_clearly(folders, change, message):
    cfg = {k: v for k, v in dict(_config_json(folders["tied"]), **change).items()
           if v is not None}
    with pytest.raises(ValueError, match=message):
        lfm2_hf_config(cfg, "Lfm2ForCausalLM")


def test_moe_config_without_layer_types_fails_clearly(folders):
    cfg = {k: v for k, v in _config_json(folders["moe"]).items() if k != "layer_types"}
    with pytest.raises(ValueError, match="lacks layer_types"):
        lfm2_hf_config(cfg, "Lfm2MoeForCausalLM")


def fake_gguf(fields: dict, tensors: tuple[str, ...] = ("output.weight",), arch="lfm2"):
    """A reader with these ``{arch}.*`` keys and tensor names, and its field function."""
    reader = SimpleNamespace(tensors=[SimpleNamespace(name=n) for n in tensors],
                             fields={"tokenizer.ggml.tokens": SimpleNamespace(data=[0] * 10)})
    base = {"block_count": 3, "embedding_length": 64, "attention.head_count": 4,
            "attention.head_count_kv": [0, 2, 0], "feed_forward_length": 160,
            "shortconv.l_cache": 3}
    values = {f"{arch}.{k}": v for k, v in {**base, **fields}.items()}
    return reader, lambda r, key, default=None: values.get(key, default)


def test_gguf_layer_types_follow_the_kv_head_counts():
    reader, field = fake_gguf({})
    config = lfm2_gguf_config(reader, field, "lfm2", "Lfm2ForCausalLM")
    assert config.linear_attn.layer_types == (LINEAR, FULL, LINEAR)
    assert config.num_kv_heads == 2 and not config.tie_word_embeddings
    reader, field = fake_gguf({"attention.head_count_kv": 2})  # one value: all attend
    assert lfm2_gguf_config(reader, field, "lfm2", "Lfm2ForCausalLM").linear_attn.layer_types \
        == (FULL,) * 3


@pytest.mark.parametrize("fields, tensors, arch, message", [
    ({"attention.head_count_kv": [0, 2]}, (), "lfm2", "2 entries for 3 layers"),
    ({"rope.scaling.type": "su"}, (), "lfm2", "rope scaling type 'su'"),
    ({}, (), "lfm2moe", "has no experts"),
    ({"expert_count": 4, "expert_used_count": 2, "expert_gating_func": 1},
     ("blk.1.ffn_gate_inp.weight",), "lfm2moe", "routes by sigmoid"),
])
def test_unsupported_gguf_files_fail_clearly(fields, tensors, arch, message):
    reader, field = fake_gguf(fields, tensors, arch)
    hf_arch = "Lfm2MoeForCausalLM" if arch == "lfm2moe" else "Lfm2ForCausalLM"
    with pytest.raises(ValueError, match=message):
        lfm2_gguf_config(reader, field, arch, hf_arch)


def test_tensor_names():
    assert lfm2_hf_name("model.embedding_norm.weight") == "norm.weight"
    assert lfm2_hf_name("model.layers.0.operator_norm.weight") == "layers.0.input_layernorm.weight"
    assert lfm2_hf_name("model.layers.0.conv.conv.weight") == "layers.0.conv.conv.weight"
    assert lfm2_hf_name("model.layers.2.self_attn.q_layernorm.weight") == \
        "layers.2.self_attn.q_norm.weight"
    assert lfm2_hf_name("model.layers.3.feed_forward.experts.7.w3.weight") == \
        "layers.3.mlp.experts.7.up_proj.weight"
    assert lfm2_hf_name("model.layers.3.feed_forward.experts.gate_up_proj") == \
        "layers.3.mlp.experts.gate_up_proj"  # transformers 5's fused experts
    assert lfm2_hf_name("model.layers.3.feed_forward.expert_bias") == "layers.3.mlp.expert_bias"
    assert lfm2_gguf_name("token_embd_norm.weight") == "norm.weight"
    assert lfm2_gguf_name("blk.1.shortconv.in_proj.weight") == "layers.1.conv.in_proj.weight"
    assert lfm2_gguf_name("blk.2.attn_qkv.weight") == "layers.2.self_attn.qkv_proj.weight"
    assert lfm2_gguf_name("blk.3.exp_probs_b.bias") == "layers.3.mlp.expert_bias"
    for bad in ("model.layers.0.conv.bogus.weight", "model.vision_tower.x.weight"):
        with pytest.raises(ValueError, match="unexpected tensor"):
            lfm2_hf_name(bad)
    for bad in ("blk.0.ssm_a", "rope_freqs.weight", "blk.x.attn_q.weight"):
        with pytest.raises(ValueError, match="unexpected GGUF tensor"):
            lfm2_gguf_name(bad)
