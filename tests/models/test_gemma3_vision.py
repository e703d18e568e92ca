"""Gemma 3's vision encoder (models/vision/) against transformers' own model.

A tiny random ``Gemma3ForConditionalGeneration`` (tests/tiny_gemma3_mmproj.py) is the
reference: ``get_image_features(pixels).pooler_output`` in float32. Our encoder loads it from
the folder (both tensor layouts) and from mmproj GGUFs written as llama.cpp's converter writes
them; F16 / BF16 / Q8_0 matrices must run as stored (BlockLinear) where the native kernels load.
"""

from __future__ import annotations

import gguf
import pytest
import tiny_gemma3_mmproj as tiny
import torch

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.vision import find_mmproj, load_vision_encoder

CPU = torch.device("cpu")
_MATRICES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight",
             "fc1.weight", "fc2.weight")  # the tower's, ftype in a GGUF
_PROJECTION = "mm_input_projection_weight"  # F16 in every GGUF


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("gemma3-vision")
    return {layout: tiny.make_gemma3_vision_hf(root / layout, seed=0, layout=layout)
            for layout in ("release", "transformers5")}


@pytest.fixture(scope="module")
def pixels() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    size = tiny.IMAGE_SIZE
    return torch.rand(3, 3, size, size, generator=gen) * 2 - 1  # the normalized range


def _reference(folder, pixels: torch.Tensor,
               rounded: dict[str, torch.dtype] | None = None) -> torch.Tensor:
    """transformers' image features, each vision weight whose name ends with a key of
    ``rounded`` first rounded to its dtype (what a GGUF of that type holds)."""
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            to = next((t for end, t in (rounded or {}).items() if name.endswith(end)), None)
            if to is not None and ("vision" in name or "projector" in name):
                param.copy_(param.to(to).float())
        out = model.eval().get_image_features(pixels)
    return out.pooler_output  # BaseModelOutputWithPooling: the projected features


def _linear_types(encoder) -> set[str]:
    return {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}


@pytest.mark.parametrize("layout", ["release", "transformers5"])
def test_folder_equals_transformers(folders, pixels, layout):
    encoder = load_vision_encoder(str(folders[layout]), None, CPU, torch.float32)
    assert encoder.tokens_per_image == tiny.TOKENS_PER_IMAGE
    assert encoder.image_shape == [3, tiny.IMAGE_SIZE, tiny.IMAGE_SIZE]
    got = encoder(pixels)
    want = _reference(folders["transformers5"], pixels)
    assert got.dtype == torch.float32 and got.shape == want.shape == (3, tiny.TOKENS_PER_IMAGE, 64)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_mmproj_f32_equals_transformers(folders, pixels, tmp_path):
    # NOTE: the converter stores the input projection as F16 even in an F32 file
    # (Gemma3VisionModel.tensor_force_quant), so the reference rounds that one matrix too
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / "mmproj-f32.gguf", "f32")
    got = load_vision_encoder(str(path), str(path), CPU, torch.float32)(pixels)
    want = _reference(folders["transformers5"], pixels, {_PROJECTION: torch.float16})
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("ftype,to,bound", [("f16", torch.float16, 1e-3),
                                            ("bf16", torch.bfloat16, 5e-3)])
def test_mmproj_16bit_runs_as_stored(folders, pixels, tmp_path, ftype, to, bound):
    """Against the reference with the same 16-bit weights: the products are exact (16-bit
    weights times float32 activations, float32 sums), only the summation order differs, so
    1e-4 holds. Against the float32 weights the rounding of every weight shows: a relative
    2^-11 (F16) / 2^-8 (BF16) per weight through 2 layers and the projection; ``bound`` of the
    largest feature is several times the error measured (2.5e-4 and 5e-4 of it)."""
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / f"mmproj-{ftype}.gguf", ftype)
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    got = encoder(pixels)
    if native.load() is not None:
        assert _linear_types(encoder) == {ftype.upper(), "F16"}  # the projection: F16
    same = _reference(folders["transformers5"], pixels,
                      {**dict.fromkeys(_MATRICES, to), _PROJECTION: torch.float16})
    torch.testing.assert_close(got, same, atol=1e-4, rtol=0)
    exact = _reference(folders["transformers5"], pixels)
    assert (got - exact).abs().max() <= bound * exact.abs().max()


def test_mmproj_q8_0_runs_as_stored(folders, pixels, tmp_path):
    """Q8_0 weights (8 bits, a scale per 32) and 8-bit activations (the block kernel's):
    measured 1.5e-3 of the largest feature; 1e-2 bounds it."""
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / "mmproj-q8_0.gguf", "q8_0")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    if native.load() is not None:
        assert _linear_types(encoder) == {"Q8_0", "F16"}
    got, want = encoder(pixels), _reference(folders["transformers5"], pixels)
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()


def test_wrong_image_shape_is_refused(folders):
    encoder = load_vision_encoder(str(folders["release"]), None, CPU, torch.float32)
    with pytest.raises(ValueError, match=r"\[3, 64, 64\]"):
        encoder(torch.zeros(1, 3, 32, 32))


def test_find_mmproj(tmp_path, folders):
    model = tmp_path / "gemma-3-4b-it-Q4_K_M.gguf"
    model.write_bytes(b"")
    assert find_mmproj(str(model)) is None
    assert find_mmproj(str(folders["release"])) is None  # a folder: its config.json decides
    mmproj = tmp_path / "mmproj-gemma-3-4b-it-f16.gguf"
    mmproj.write_bytes(b"")
    assert find_mmproj(str(model)) == str(mmproj)
    assert find_mmproj(str(mmproj)) is None  # the file itself never counts
    (tmp_path / "gemma-3-4b-it-MMPROJ-bf16.gguf").write_bytes(b"")
    assert find_mmproj(str(model)) is None  # two: --mmproj must pick


def _clip_gguf(path, projector: str | None, arch: str = "clip"):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_clip_has_vision_encoder(True)
    if projector is not None:
        writer.add_clip_projector_type(projector)
    writer.add_tensor("v.post_ln.weight", torch.ones(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_unsupported_projector_is_a_value_error(tmp_path):
    path = _clip_gguf(tmp_path / "mmproj-qwen.gguf", "qwen2vl_merger")
    with pytest.raises(ValueError, match=r"'qwen2vl_merger' is not supported yet.*gemma3"):
        load_vision_encoder(str(tmp_path / "model.gguf"), path, CPU, torch.float32)


def test_not_an_mmproj_is_a_value_error(tmp_path):
    path = _clip_gguf(tmp_path / "model.gguf", "gemma3", arch="llama")
    with pytest.raises(ValueError, match="not an mmproj"):
        load_vision_encoder(path, path, CPU, torch.float32)


def test_text_only_models_have_no_encoder(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    assert load_vision_encoder(str(folder), None, CPU, torch.float32) is None
    assert load_vision_encoder(str(tmp_path / "model.gguf"), None, CPU, torch.float32) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(
        '{"architectures": ["Qwen3VLMoeForConditionalGeneration"], "vision_config": {}}')
    assert load_vision_encoder(str(other), None, CPU, torch.float32) is None  # text only


def test_load_logs_what_it_loaded(folders, tmp_path, caplog):
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / "mmproj-q8_0.gguf", "q8_0")
    with caplog.at_level("INFO", logger="radixserve.models.vision.load"):
        load_vision_encoder(str(path), str(path), CPU, torch.float32)
    [line] = [r.getMessage() for r in caplog.records]
    assert "SigLIP 2 layers" in line and "16 tokens per 64px image" in line
    if native.load() is not None:
        assert "Q8_0 as stored" in line and "F16 as stored" in line


def test_without_native_kernels_16bit_matrices_run_in_torch(folders, pixels, tmp_path,
                                                            monkeypatch):
    """Where no stored kernel runs (no native kernels; CUDA) the matrices become torch linears
    in the engine's dtype, the same values: the F16 file still equals its rounded reference."""
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / "mmproj-f16.gguf", "f16")
    monkeypatch.setattr(native, "load", lambda: None)
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert not _linear_types(encoder)
    same = _reference(folders["transformers5"], pixels,
                      dict.fromkeys((*_MATRICES, _PROJECTION), torch.float16))
    torch.testing.assert_close(encoder(pixels), same, atol=1e-4, rtol=0)


def test_folder_in_bfloat16(folders, pixels):
    """The engine's dtype on CUDA: every float tensor in bfloat16 (8-bit mantissa), float32
    out; 2e-2 of the largest feature is several times the error measured."""
    encoder = load_vision_encoder(str(folders["release"]), None, CPU, torch.bfloat16)
    got, want = encoder(pixels), _reference(folders["transformers5"], pixels)
    assert got.dtype == torch.float32
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_missing_or_misshapen_weights_are_value_errors(folders, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(folders["release"], tmp_path / "broken")
    state = load_file(folder / "model.safetensors")
    fc1 = "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight"
    save_file({**state, fc1: state[fc1][:, :8].contiguous()}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"encoder.layers.1.mlp.fc1.weight of shape \(64, 8\)"):
        load_vision_encoder(str(folder), None, CPU, torch.float32)
    del state["multi_modal_projector.mm_soft_emb_norm.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match="missing.*mm_soft_emb_norm"):
        load_vision_encoder(str(folder), None, CPU, torch.float32)


def test_bfloat16_attention(folders, pixels, monkeypatch):
    """Where the CPU has AMX the tower's attention runs in bfloat16 (models/vision/
    attention_dtype.py): the features stay within 1e-2 of the largest (measured ~1e-3), the
    choice is logged in the encoder's line; an unknown setting is a ValueError."""
    from radixserve.kernels import native
    from radixserve.models.vision.attention_dtype import ENV, vision_attention_dtype

    monkeypatch.delenv(ENV, raising=False)
    auto, _ = vision_attention_dtype(CPU, torch.float32)
    has_amx = native.load() is not None and native.describe().amx_tiles
    assert auto == (torch.bfloat16 if has_amx else torch.float32)
    assert vision_attention_dtype(CPU, torch.bfloat16)[0] == torch.bfloat16
    monkeypatch.setenv(ENV, "bfloat16")
    encoder = load_vision_encoder(str(folders["release"]), None, CPU, torch.float32)
    assert "attention bfloat16" in encoder.describe()
    got, want = encoder(pixels), _reference(folders["transformers5"], pixels)
    assert got.dtype == torch.float32
    scale = want.abs().max()
    assert 1e-5 * scale < (got - want).abs().max() <= 1e-2 * scale  # bfloat16 did run
    monkeypatch.setenv(ENV, "float16")
    with pytest.raises(ValueError, match=ENV):
        vision_attention_dtype(CPU, torch.float32)


def test_bfloat16_matmuls(folders, pixels, monkeypatch, tmp_path):
    """Where the CPU has AMX an F16 mmproj's matrices multiply in bfloat16 (models/vision/
    stored.py `Bf16Linear`: ~5x the float32 kernel there): the features stay within 2e-2 of
    the largest, the load's line says so; float32 keeps the stored-F16 kernel."""
    from radixserve.kernels import native
    from radixserve.models.vision.attention_dtype import MATMUL_ENV, vision_matmul_dtype

    monkeypatch.delenv(MATMUL_ENV, raising=False)
    has_amx = native.load() is not None and native.describe().amx_tiles
    auto, _ = vision_matmul_dtype(CPU, torch.float32)
    assert auto == (torch.bfloat16 if has_amx else torch.float32)
    path = tiny.gemma3_mmproj_gguf(folders["release"], tmp_path / "mmproj-f16.gguf", "f16")
    monkeypatch.setenv(MATMUL_ENV, "bfloat16")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert "F16 as bfloat16 GEMM" in encoder.describe()
    got, want = encoder(pixels), _reference(folders["transformers5"], pixels)
    scale = want.abs().max()
    assert got.dtype == torch.float32
    assert 1e-5 * scale < (got - want).abs().max() <= 2e-2 * scale  # bfloat16 did run
    monkeypatch.setenv(MATMUL_ENV, "float32")
    assert "bfloat16 GEMM" not in load_vision_encoder(str(path), str(path), CPU,
                                                      torch.float32).describe()
