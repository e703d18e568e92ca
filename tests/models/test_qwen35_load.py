"""Qwen3.5 checkpoints load as transformers holds them: the shape from config.json (a
Qwen3_5ForCausalLM folder or a Qwen3_5ForConditionalGeneration one) and from the GGUF file
llama.cpp's converter writes are the same, and every tensor of that file, mapped and
transformed back (names, shapes, values, V-head order), is transformers' own. The as-stored
paths (GGUF blocks, 16-bit folders) are checked on a stand-in module with the same layer
names (not the model class), so only the loading is under test."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tiny_hybrid import make_qwen35_hf_model, qwen35_hf_to_gguf, reorder_v_heads
from torch import nn

from radixserve.gguf_reader import open_gguf
from radixserve.kernels import native
from radixserve.model_config import FULL, LINEAR
from radixserve.models.gguf_stored import load_stored
from radixserve.models.half_stored import load_half_stored
from radixserve.models.loader import load_model_config
from radixserve.models.qwen35_config import (
    qwen35_gguf_config,
    qwen35_hf_config,
    qwen35_hf_name,
    qwen35_hf_weights,
)
from radixserve.models.qwen35_gguf import InputPermuted, Qwen35Gguf, untile_order
from radixserve.models.mtp_source import mtp_layers_in
from radixserve.models.source import ModelSource

# The converter stores A as -exp(A_log) and the 1 + w norms as 1 + w: taking the log and
# subtracting 1 back is exact to a float32 rounding, not to the bit.
ROUNDED = ("A_log", "norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels not built")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35_load")
    return {"plain": make_qwen35_hf_model(root / "plain", seed=0),
            "conditional": make_qwen35_hf_model(root / "conditional", seed=0, conditional=True,
                                                mtp=True)}


def config_of(path):
    return load_model_config(ModelSource.resolve(str(path)))


def raw_state(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def hf_state(folder) -> dict[str, torch.Tensor]:
    return dict(qwen35_hf_weights(raw_state(folder).items()))


def assert_same_config(a, b):
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x == (pytest.approx(y, rel=1e-6) if isinstance(y, float) else y), f.name


def assert_same_tensors(ours: dict, hf: dict, exact: bool = True):
    assert sorted(ours) == sorted(hf)
    for name, t in hf.items():
        assert ours[name].shape == t.shape, name
        if exact and not name.endswith(ROUNDED):
            assert torch.equal(ours[name], t.float()), name
        else:
            torch.testing.assert_close(ours[name], t.float(), atol=1e-6, rtol=1e-6, msg=name)


def test_hf_config_reads_the_hybrid_shape(folders):
    config = config_of(folders["plain"])
    la = config.linear_attn
    assert config.architecture == "Qwen3_5ForCausalLM"
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.head_dim, config.intermediate_size) == (4, 64, 4, 2, 16, 128)
    assert config.rotary_dim == 4 and config.rope_theta == 10000.0 and config.rope_scaling is None
    assert config.attn_output_gate and config.qk_norm and not config.tie_word_embeddings
    assert la.layer_types == (LINEAR, LINEAR, LINEAR, FULL)
    assert (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim,
            la.conv_kernel) == (2, 4, 16, 16, 4)


def test_conditional_generation_folder_is_its_text_model(folders):
    """The vision + text folder runs as the same text model: same shape, same tensors (the
    ``model.language_model.`` prefix gone, ``model.visual.*`` skipped; its MTP block's
    ``mtp.*`` kept for ``--speculative mtp``, the model drops them otherwise)."""
    assert config_of(folders["conditional"]) == config_of(folders["plain"])
    raw = raw_state(folders["conditional"])
    assert any(n.startswith("model.visual.") for n in raw) and any(n.startswith("mtp.")
                                                                   for n in raw)
    text = hf_state(folders["conditional"])
    assert {n for n in text if n.startswith("mtp.")} == {n for n in raw if n.startswith("mtp.")}
    assert_same_tensors({n: t for n, t in text.items() if not n.startswith("mtp.")},
                        hf_state(folders["plain"]))


@pytest.mark.parametrize("kind", ["plain", "conditional"])
def test_gguf_config_equals_hf_config(folders, kind, tmp_path):
    """Field by field, also for a file with an MTP block (five blocks, four layers run)."""
    gguf = qwen35_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    if kind == "conditional":
        assert open_gguf(str(gguf)).fields["qwen35.block_count"].contents() == 5
    assert_same_config(config_of(gguf), config_of(folders[kind]))


@pytest.mark.parametrize("kind", ["plain", "conditional"])
def test_gguf_tensors_map_back_to_transformers_state_dict(folders, kind, tmp_path):
    """Every tensor the decoder runs, from an F32 file: transformers' name, shape and values
    (V heads back in grouped order, A_log, conv1d [C, 1, K], norms as w); nothing else. The
    conditional folder's MTP block (nextn tensors in the file) too, as ``mtp.*``, when it
    runs (``--speculative mtp``)."""
    gguf = qwen35_hf_to_gguf(folders[kind], tmp_path / "m.gguf", "F32")
    reader = open_gguf(str(gguf))
    config = config_of(gguf)
    num_mtp = mtp_layers_in(ModelSource.resolve(str(gguf)), config, reader)
    assert num_mtp == (1 if kind == "conditional" else 0)
    layout = Qwen35Gguf(dataclasses.replace(config, num_mtp_layers=num_mtp))
    ours = dict(layout.weights(reader))
    assert_same_tensors(ours, hf_state(folders[kind]))


def test_as_many_value_heads_as_key_heads_keep_their_order(tmp_path):
    """No V-head reordering to undo (the converter leaves such files as they are)."""
    hf = make_qwen35_hf_model(tmp_path / "mha", seed=3, linear_num_value_heads=2)
    gguf = qwen35_hf_to_gguf(hf, tmp_path / "m.gguf", "F32")
    layout = Qwen35Gguf(config_of(gguf))
    assert layout.row_order("layers.0.linear_attn.in_proj_z") is None
    assert layout.input_order("layers.0.linear_attn.out_proj") is None
    assert_same_tensors(dict(layout.weights(open_gguf(str(gguf)))), hf_state(hf))


def test_tied_head_has_no_output_tensor(tmp_path):
    hf = make_qwen35_hf_model(tmp_path / "tied", seed=1, tie_word_embeddings=True)
    gguf = qwen35_hf_to_gguf(hf, tmp_path / "t.gguf", "F16")
    assert config_of(gguf).tie_word_embeddings and config_of(hf).tie_word_embeddings
    assert "lm_head.weight" not in dict(Qwen35Gguf(config_of(gguf)).weights(open_gguf(str(gguf))))


def test_untile_order_undoes_the_converters_v_head_reorder():
    w = np.arange(6 * 3 * 5, dtype=np.float32).reshape(6 * 3, 5)  # 6 value heads of 3
    tiled = torch.from_numpy(reorder_v_heads(w, 0, 2, 6, 3))
    assert torch.equal(tiled[untile_order(2, 6, 3)], torch.from_numpy(w))
    assert torch.equal(untile_order(4, 4, 8), torch.arange(32))  # as many key as value heads


# -- the as-stored paths, on a stand-in with the model's layer names ------------------------

class StandIn(nn.Module):
    """Meta-device ``nn.Linear`` at every matrix's transformers name, an embedding, and a
    ``load_weights`` that keeps what it is given."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.rotary = SimpleNamespace(reset_tables=lambda device: None)
        self.embed_tokens, self.loaded = None, {}
        for name, w in state.items():
            if w.ndim == 2 and name.endswith(".weight") and "embed_tokens" not in name:
                *path, leaf, _ = name.split(".")
                parent = self
                for part in path:
                    if not hasattr(parent, part):
                        parent.add_module(part, nn.Module())
                    parent = getattr(parent, part)
                with torch.device("meta"):
                    parent.add_module(leaf, nn.Linear(w.shape[1], w.shape[0], bias=False))
        if not hasattr(self, "lm_head"):  # tied
            self.lm_head = None

    def load_weights(self, weights) -> None:
        self.loaded.update((n, t.clone()) for n, t in weights)

    def matrices(self) -> dict[str, torch.Tensor]:
        """Each layer's weight as its output on the identity: [out, in]."""
        found = {}
        for prefix, parent in self.named_modules():
            for name, child in parent.named_children():
                if name != "inner" and hasattr(child, "forward") and (
                        "proj" in name or name == "lm_head"):
                    eye = torch.eye(child.inner.in_features if isinstance(child, InputPermuted)
                                    else child.in_features)
                    found[f"{prefix}.{name}.weight".lstrip(".")] = child(eye).T
        return found


@needs_native
@pytest.mark.parametrize("ftype, atol", [("F16", 1e-3), ("Q8_0", 5e-3)])
def test_stored_gguf_matrices_keep_transformers_order(folders, tmp_path, ftype, atol):
    """Matrices kept in the file's blocks (rows of in_proj_qkv / z / a / b reordered,
    out_proj fed its inputs in the file's column order) compute transformers' weights; the
    float tensors reach ``load_weights`` as transformers holds them."""
    hf = hf_state(folders["plain"])
    gguf = qwen35_hf_to_gguf(folders["plain"], tmp_path / "m.gguf", ftype)
    config, reader = config_of(gguf), open_gguf(str(gguf))
    layout = Qwen35Gguf(config)
    model = load_stored(StandIn(hf), reader, config, torch.device("cpu"), layout.hf_name, None,
                        False, layout=layout)
    assert isinstance(model.get_submodule("layers.0.linear_attn.out_proj"), InputPermuted)
    matrices = model.matrices()
    assert sorted(matrices) == sorted(n for n, w in hf.items()
                                      if w.ndim == 2 and "embed_tokens" not in n)
    for name, w in matrices.items():  # F16: the rounding of a weight ~ 0.3 is < 1e-3
        torch.testing.assert_close(w, hf[name], atol=atol, rtol=0, msg=name)
    floats = {n: t for n, t in hf.items() if t.ndim != 2}
    assert_same_tensors(model.loaded, floats)


@needs_native
def test_half_stored_conditional_folder_loads_the_text_model(tmp_path):
    """A bfloat16 ConditionalGeneration folder (what the releases are) through the 16-bit
    path: vision and MTP tensors skipped, the text model's names."""
    folder = make_qwen35_hf_model(tmp_path / "bf16", seed=2, conditional=True, mtp=True,
                                  save_dtype=torch.bfloat16)
    hf = hf_state(folder)
    model = load_half_stored(StandIn(hf), str(folder), torch.device("cpu"), False,
                             rename=qwen35_hf_name)
    for name, w in model.matrices().items():
        torch.testing.assert_close(w, hf[name].float(), atol=0, rtol=0, msg=name)
    floats = {n: t for n, t in hf.items() if t.ndim != 2 or n == "embed_tokens.weight"}
    assert_same_tensors(model.loaded, floats)  # the untied embedding stays a float table


# -- what is refused ------------------------------------------------------------------------

def _config_json(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"layer_types": [LINEAR, FULL]}, "2 entries for 4 layers"),
    ({"layer_types": [LINEAR, "sliding_attention", LINEAR, FULL]}, "unknown layer types"),
    ({"linear_num_value_heads": 3}, "multiple of key heads"),
    ({"full_attention_interval": 0, "layer_types": None}, "full_attention_interval"),
])
def test_unsupported_configs_fail_clearly(folders, change, message):
    cfg = dict(_config_json(folders["plain"]), **change)
    with pytest.raises(ValueError, match=message):
        qwen35_hf_config(cfg, "Qwen3_5ForCausalLM")


def test_conditional_config_needs_text_config(folders):
    cfg = {k: v for k, v in _config_json(folders["conditional"]).items() if k != "text_config"}
    with pytest.raises(ValueError, match="text_config"):
        qwen35_hf_config(cfg, "Qwen3_5ForConditionalGeneration")
    with pytest.raises(ValueError, match="lacks"):
        qwen35_hf_config({"hidden_size": 8}, "Qwen3_5ForCausalLM")


def test_layer_types_default_to_full_attention_interval(folders):
    cfg = {k: v for k, v in _config_json(folders["plain"]).items() if k != "layer_types"}
    cfg.update(num_hidden_layers=6, full_attention_interval=3)
    types = qwen35_hf_config(cfg, "Qwen3_5ForCausalLM").linear_attn.layer_types
    assert types == (LINEAR, LINEAR, FULL, LINEAR, LINEAR, FULL)


def fake_gguf(fields: dict, tensors: tuple[str, ...]):
    """A reader with these ``qwen35.*`` keys and tensor names, and its field function."""
    reader = SimpleNamespace(tensors=[SimpleNamespace(name=n) for n in tensors],
                             fields={"tokenizer.ggml.tokens": SimpleNamespace(data=[0] * 10)})
    base = {"block_count": 4, "embedding_length": 64, "attention.head_count": 4,
            "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.state_size": 16,
            "ssm.inner_size": 64, "ssm.conv_kernel": 4, "feed_forward_length": 128}
    values = {f"qwen35.{k}": v for k, v in {**base, **fields}.items()}
    return reader, lambda r, key, default=None: values.get(key, default)


def test_gguf_without_recurrent_layers_uses_the_interval():
    reader, field = fake_gguf({"full_attention_interval": 2}, ("blk.0.attn_norm.weight",))
    config = qwen35_gguf_config(reader, field, "qwen35", "Qwen3_5ForCausalLM")
    assert config.linear_attn.layer_types == (LINEAR, FULL, LINEAR, FULL)


@pytest.mark.parametrize("fields, tensors, message", [
    ({"rope.scaling.type": "yarn"}, ("blk.0.attn_norm.weight",), "rope scaling 'yarn'"),
    ({"nextn_predict_layers": 1}, ("blk.4.nextn.eh_proj.weight",), "only an MTP draft"),
])
def test_unsupported_gguf_files_fail_clearly(fields, tensors, message):
    reader, field = fake_gguf(fields, tensors)
    with pytest.raises(ValueError, match=message):
        qwen35_gguf_config(reader, field, "qwen35", "Qwen3_5ForCausalLM")


def test_gguf_names(folders):
    layout = Qwen35Gguf(config_of(folders["plain"]))
    assert layout.hf_name("blk.0.ssm_a") == "layers.0.linear_attn.A_log"
    assert layout.hf_name("blk.1.ssm_dt.bias") == "layers.1.linear_attn.dt_bias"
    assert layout.hf_name("blk.3.attn_q.weight") == "layers.3.self_attn.q_proj.weight"
    assert layout.hf_name("blk.4.nextn.eh_proj.weight") is None  # the MTP block
    assert layout.hf_name("blk.4.attn_q.weight") is None
    for bad, message in [("blk.3.attn_qkv.weight", "--fuse-qkv"),
                         ("blk.3.ssm_a", "unexpected"), ("rope_freqs.weight", "unexpected"),
                         ("blk.0.ssm_in.weight", "unexpected")]:
        with pytest.raises(ValueError, match=message):
            layout.hf_name(bad)
