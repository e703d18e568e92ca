"""Granite checkpoints load as transformers holds them: the shape from config.json (every
Granite kind; the Granite 4 releases' and transformers 5's layer-type names) and from the GGUF
file llama.cpp's converter writes are the same, and every tensor of that file, mapped and
transformed back (names, Q/K rows, Mamba2's A, D, conv and norm shapes), is transformers' own
(the fused experts cut per expert, the shared MLP's gate and up as ``input_linear`` holds
them)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file
from tiny_granite import KINDS, granite_hf_to_gguf, make_granite_hf_model
from tiny_models import permute_qk

from radixserve.gguf_reader import open_gguf
from radixserve.model_config import FULL, LINEAR, GraniteParams, MoeConfig
from radixserve.models.granite_config import GRANITE_HYBRID, granite_hf_config, granite_hf_name
from radixserve.models.granite_gguf import GraniteGguf, unpermute_order
from radixserve.models.loader import load_model_config
from radixserve.models.moe import unfuse_hf_experts
from radixserve.models.source import ModelSource
from radixserve.recurrent_params import Mamba2Params

# the converter stores A = -exp(A_log): the log back is exact to a float32 rounding
ROUNDED = ("A_log",)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("granite_load")
    return {kind: make_granite_hf_model(kind, root / kind, seed=0) for kind in KINDS}


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def hf_state(folder) -> dict[str, torch.Tensor]:
    """The folder's tensors under the model's names, fused experts cut per expert, the shared
    MLP's fused gate / up in halves (as GGUF files hold them)."""
    raw = load_file(str(folder / "model.safetensors"))
    state = {}
    for name, t in unfuse_hf_experts((granite_hf_name(n), t) for n, t in raw.items()):
        if name.endswith("shared_mlp.gate_up_proj.weight"):
            gate, up = t.chunk(2)
            state[name.replace("gate_up_proj", "gate_proj")] = gate
            state[name.replace("gate_up_proj", "up_proj")] = up
        else:
            state[name] = t
    return state


def config_json(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def assert_same_config(a, b, skip=()):
    """Field by field, floats to float32 rounding (GGUF stores them so)."""
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in skip:
            continue
        if dataclasses.is_dataclass(y):
            assert_same_config(x, y)
        else:
            assert x == (pytest.approx(y, rel=1e-6) if isinstance(y, float) else y), f.name


def test_hf_config_reads_the_hybrid_shape(folders):
    config = config_of(folders["hybrid-moe"])
    assert config.architecture == GRANITE_HYBRID
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size) == (4, 64, 4, 2, 16, 32)
    assert config.moe == MoeConfig(4, 2, 32, norm_topk_prob=True)
    assert config.granite == GraniteParams(12.0, 0.0625, 0.22, 2.5, shared_intermediate_size=96,
                                           rope=False)
    assert config.linear_attn == Mamba2Params(
        layer_types=(LINEAR, LINEAR, FULL, LINEAR), num_heads=8, head_dim=16, state_size=16,
        n_groups=2, conv_kernel=4, time_step_limit=(0.0, math.inf), conv_bias=True,
        proj_bias=False)
    assert config.attention_layers == (2,)


def test_dense_kinds(folders):
    """A dense hybrid's only MLP is the shared one; Granite 3 is Llama-shaped with RoPE."""
    hybrid, granite = config_of(folders["hybrid"]), config_of(folders["granite"])
    assert hybrid.moe is None and hybrid.granite.shared_intermediate_size == 128
    assert granite.linear_attn is None and granite.moe is None and granite.granite.rope
    assert (granite.intermediate_size, granite.granite.shared_intermediate_size) == (128, 0)
    shared = config_of(folders["granitemoeshared"])
    assert shared.moe == MoeConfig(4, 2, 32) and shared.granite.shared_intermediate_size == 96


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_config_equals_hf_config(folders, kind, tmp_path):
    """Field by field; a hybrid's GGUF context is llama.cpp's 2**20 (no RoPE: the converter
    writes no limit)."""
    gguf = config_of(granite_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32"))
    folder = config_of(folders[kind])
    hybrid = kind.startswith("hybrid")
    assert_same_config(gguf, folder, skip=("max_position_embeddings",) if hybrid else ())
    assert gguf.max_position_embeddings == (2**20 if hybrid else 512)


@pytest.mark.parametrize("kind", ["granite", "granitemoeshared", "hybrid", "hybrid-moe"])
def test_gguf_tensors_map_back_to_transformers_state_dict(folders, kind, tmp_path):
    """Every tensor of an F32 file: the model's name, shape and value of transformers' tensor
    (Q/K rows unpermuted, A_log, D, conv1d [C, 1, K], the gated norm [inner])."""
    gguf = granite_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    ours = dict(GraniteGguf(config_of(gguf)).weights(open_gguf(str(gguf))))
    hf = hf_state(folders[kind])
    assert sorted(ours) == sorted(hf)
    for name, t in hf.items():
        assert ours[name].shape == t.shape, name
        if name.endswith(ROUNDED):
            torch.testing.assert_close(ours[name], t, atol=1e-6, rtol=1e-6, msg=name)
        else:
            assert torch.equal(ours[name], t), name


def test_tied_head_has_no_output_tensor(tmp_path):
    folder = make_granite_hf_model("hybrid-moe", tmp_path / "tied", tie_word_embeddings=True)
    gguf = granite_hf_to_gguf(folder, tmp_path / "t.gguf", "F32")
    assert "output.weight" not in {t.name for t in open_gguf(str(gguf)).tensors}
    assert config_of(gguf).tie_word_embeddings and config_of(folder).tie_word_embeddings


def test_transformers5_names_and_legacy_keys_read_the_same(folders):
    """transformers 5 saves "linear_attention" / "full_attention" and infinity as an object;
    older configs name the pattern ``layers_block_type``."""
    cfg = config_json(folders["hybrid-moe"])
    release = granite_hf_config(cfg, GRANITE_HYBRID)
    names = {"mamba": LINEAR, "attention": FULL}
    saved = dict(cfg, layer_types=[names[t] for t in cfg["layer_types"]],
                 time_step_limit=[0.0, {"__float__": "Infinity"}])
    assert granite_hf_config(saved, GRANITE_HYBRID) == release
    legacy = {k: v for k, v in cfg.items() if k != "layer_types"}
    legacy["layers_block_type"] = cfg["layer_types"]
    assert granite_hf_config(legacy, GRANITE_HYBRID) == release


def test_an_all_attention_hybrid_folder_is_a_plain_decoder(folders):
    """Granite 4.0-Micro: a GraniteMoeHybrid folder with attention layers only, and RoPE."""
    cfg = dict(config_json(folders["hybrid"]), layer_types=["attention"] * 4,
               position_embedding_type="rope")
    config = granite_hf_config(cfg, GRANITE_HYBRID)
    assert config.linear_attn is None and config.attention_layers == (0, 1, 2, 3)
    assert config.granite.rope and config.granite.shared_intermediate_size == 128


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"layer_types": ["mamba", "conv", "attention", "mamba"]}, "layer_types \\['conv'\\]"),
    ({"layer_types": ["mamba", "attention"]}, "4 of"),
    ({"mamba_d_head": 8}, "must equal mamba_expand x hidden_size"),
    ({"shared_intermediate_size": 0}, "shared_intermediate_size > 0"),
])
def test_unsupported_configs_fail_clearly(folders, change, message):
    cfg = dict(config_json(folders["hybrid-moe"]), **change)
    with pytest.raises(ValueError, match=message):
        granite_hf_config(cfg, GRANITE_HYBRID)


def test_gguf_names(folders):
    moe = GraniteGguf(config_of(folders["hybrid-moe"]))
    assert moe.hf_name("blk.0.ssm_a") == "layers.0.mamba.A_log"
    assert moe.hf_name("blk.0.ssm_d") == "layers.0.mamba.D"
    assert moe.hf_name("blk.1.ssm_dt.bias") == "layers.1.mamba.dt_bias"
    assert moe.hf_name("blk.1.ffn_up_shexp.weight") == "layers.1.shared_mlp.up_proj.weight"
    assert moe.hf_name("blk.1.ffn_gate_inp.weight") == "layers.1.mlp.gate.weight"
    dense = GraniteGguf(config_of(folders["hybrid"]))
    assert dense.hf_name("blk.1.ffn_up.weight") == "layers.1.shared_mlp.up_proj.weight"
    granite = GraniteGguf(config_of(folders["granite"]))
    assert granite.hf_name("blk.1.ffn_up.weight") == "layers.1.mlp.up_proj.weight"
    assert moe.hf_name("rope_freqs.weight") is None  # llama3 rope scaling: in the config
    for bad, message in [("blk.2.attn_qkv.weight", "--fuse-qkv"), ("blk.4.attn_q.weight",
                         "unexpected"), ("rope_factors_long.weight", "unexpected"),
                         ("blk.0.ssm_x.weight", "unexpected")]:
        with pytest.raises(ValueError, match=message):
            moe.hf_name(bad)


def test_folder_names():
    assert (granite_hf_name("model.layers.3.block_sparse_moe.input_linear.weight")
            == "layers.3.mlp.experts.gate_up_proj")
    assert (granite_hf_name("model.layers.3.block_sparse_moe.router.layer.weight")
            == "layers.3.mlp.gate.weight")
    assert (granite_hf_name("model.layers.0.shared_mlp.output_linear.weight")
            == "layers.0.shared_mlp.down_proj.weight")
    assert granite_hf_name("model.layers.0.mamba.A_log") == "layers.0.mamba.A_log"
    assert granite_hf_name("lm_head.weight") == "lm_head.weight"


def test_unpermute_order_undoes_the_converters_qk_permutation():
    w = torch.arange(4 * 16 * 3, dtype=torch.float32).reshape(64, 3)
    stored = torch.from_numpy(permute_qk(w.numpy(), 4))
    assert torch.equal(stored[unpermute_order(64, 4)], w)
