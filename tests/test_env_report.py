"""``radixserve env``: what runs here, from the model's metadata alone."""

from __future__ import annotations

import pytest

from radixserve.env_report import layer_plan, report, stored_types
from radixserve.kernels import native

needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")


@needs_native
def test_report_names_the_level_the_layers_and_the_memory_of_the_embedded_model():
    text = report(None)
    info = native.describe()
    assert f"selected: {info.level}" in text
    assert "GGUF blocks as stored (Q4_1, Q8_0)" in text
    assert "quantization auto -> gguf" in text
    # the tied table once: the head's packed rows serve the lookups
    assert "memory: weights 96.6 MB as stored (file 96.6 MB)" in text
    assert "sizes this model splits into: 1, 3" in text  # 9 heads, 3 KV heads
    assert "all-reduce (--tp-all-reduce auto): " in text
    int8 = report(None, "int8")
    assert "int8, native" in int8 and "memory:" not in int8


def test_layer_plan_and_startup_line_say_what_each_layer_type_runs():
    plan = layer_plan("gguf", "cpu_native", "avx2", None, ("Q4_K", "Q6_K"))
    assert plan["linear layers (qkv, o, gate_up, down)"] == \
        "GGUF blocks as stored (Q4_K, Q6_K), native (avx2)"
    assert plan["embedding"] == "stored rows, dequantized per lookup"
    assert plan["decoder layers"] == "one native call per layer"
    assert layer_plan("none", "torch", None, "no native kernels")[
        "linear layers (qkv, o, gate_up, down)"] \
        == "float (torch)"
    assert stored_types(None) == ()
    from radixserve.models.native_stack import KernelPlan

    line = KernelPlan("avx2", "int8, native (avx2)", True, "cpu_native",
                      "sparse MoE blocks have no native layer call").startup_line(
        "torch.float16", 2)
    assert "int8, native" in line and "Python layers" in line and "threads 2" in line


def test_only_moe_blocks_and_partial_rotary_keep_the_python_layers():
    from types import SimpleNamespace as Config

    from radixserve.env_report import python_layers_of

    def python_only_layers(config):
        return python_layers_of(config, "gguf", "cpu_native", "avx2") is not None

    # Gemma's layers and q/k norms (Qwen3, Gemma 3) run one native call per layer
    assert not python_only_layers(Config(moe=None, rotary_dim=None, qk_norm=True, gemma=object(),
                                         head_dim=64, architecture="Gemma3ForCausalLM"))
    assert python_only_layers(Config(moe=object(), rotary_dim=None, head_dim=64,
                                     architecture="Qwen3MoeForCausalLM"))
    assert python_only_layers(Config(moe=None, rotary_dim=32, head_dim=64,
                                     architecture="Phi3ForCausalLM"))


@needs_native
def test_env_and_the_built_model_agree_on_what_runs(embedded_llm):
    """The engine's line reads the built model's plan; ``env`` applies the build's rule to the
    model's metadata: the two agree on the embedded model."""
    from radixserve.env_report import python_layers_of

    model = embedded_llm.engine.runner.model
    plan = model.kernel_plan
    assert plan.python_layers is None and plan.elementwise and plan.attention == "cpu_native"
    assert python_layers_of(model.config, "gguf", plan.attention, plan.level) is None
    assert plan.linears == f"GGUF blocks as stored (Q4_1, Q8_0), native ({plan.level})"
    assert "decoder layers: one native call per layer" in plan.startup_line("float16", 2)


def test_a_hybrid_model_reports_its_recurrent_state_slot(tmp_path):
    from tiny_hybrid import make_qwen35_hf_model

    text = report(str(make_qwen35_hf_model(tmp_path / "hf", seed=1)))
    # 3 Gated DeltaNet layers: a conv window [3, 2*2*16 + 4*16] and a [4, 16, 16] fp32 state each
    per_slot = 3 * (3 * 128 * 4 + 4 * 16 * 16 * 4) / 2**20
    assert f"recurrent states: 3 LinearAttnParams layers, {per_slot:.1f} MiB a slot" in text
    assert "recurrent states" not in report(None)


def test_a_vision_model_reports_its_image_encoder(tmp_path):
    """A GGUF with llama.cpp's mmproj beside it: where the image encoder comes from and the
    vision attention's type (tests pin float32: conftest.py); a text model has no such line."""
    from tiny_gemma3_mmproj import gemma3_mmproj_gguf
    from tiny_gemma3_vlm import gemma3_vlm_text_gguf, make_gemma3_vlm_hf

    folder = make_gemma3_vlm_hf(tmp_path / "hf", seed=3)
    model = gemma3_vlm_text_gguf(folder, tmp_path / "m.gguf", "Q8_0")
    assert "images:" not in report(str(model))
    gemma3_mmproj_gguf(folder, tmp_path / "mmproj-m-f16.gguf", "f16")
    text = report(str(model))
    assert ("images: mmproj-m-f16.gguf beside the model (projector gemma3); vision attention "
            "float32 (RADIXSERVE_VISION_ATTENTION=float32)") in text
    assert "images: the folder's vision tower (Gemma3ForConditionalGeneration)" in \
        report(str(folder))
    assert "images:" not in report(None)
