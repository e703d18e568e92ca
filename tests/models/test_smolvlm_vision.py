"""SmolVLM in the engine against transformers' own ``SmolVLMForConditionalGeneration``
(tests/tiny_smolvlm.py): the vision encoder (SigLIP tower + pixel shuffle + modality
projection) on a batch of tiles = ``get_image_features``, from the folder and from mmproj
GGUFs as llama.cpp's converter writes them; the text model (a Llama under
``model.text_model.``) from the folder and from the converter's text GGUF: logits and
``LLM``'s greedy tokens on text prompts; the image specials stay single tokens."""

from __future__ import annotations

import pytest
import safetensors
import tiny_smolvlm as tiny
import torch
from test_windowed_models import Paged, hf_logits, prompts, runner_for
from transformers import SmolVLMForConditionalGeneration

from radixserve.kernels import native
from radixserve.layers.block_linear import BlockLinear
from radixserve.models.loader import load_model_config
from radixserve.models.smolvlm_config import smolvlm_hf_config
from radixserve.models.source import ModelSource
from radixserve.models.vision import load_vision_encoder
from radixserve.models.vision.smolvlm import full_tile_position_ids
from radixserve.tokenizer.tokenizer import load_tokenizer

CPU = torch.device("cpu")
ATOL = 1e-4
ARCH = "SmolVLMForConditionalGeneration"
_MATRICES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight",
             "fc1.weight", "fc2.weight", "modality_projection.proj.weight")  # ftype in a GGUF


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.make_smolvlm_hf(tmp_path_factory.mktemp("smolvlm") / "hf", seed=3)


@pytest.fixture(scope="module")
def reference(folder):
    return SmolVLMForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tiles() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.rand(5, 3, tiny.TILE, tiny.TILE, generator=gen) * 2 - 1  # normalized range


@pytest.fixture(scope="module")
def text_files(folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("smolvlm-gguf")
    return {ftype: tiny.smolvlm_text_gguf(folder, root / f"text-{ftype}.gguf", ftype)
            for ftype in ("F32", "Q8_0")}


def _features(folder, tiles: torch.Tensor, rounded: torch.dtype | None = None) -> torch.Tensor:
    """transformers' features of ``tiles`` (one sample of n tiles) as [n, tokens, hidden];
    with ``rounded``, the vision matrices a GGUF stores in ``ftype`` rounded to it first."""
    model = SmolVLMForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        if rounded is not None:
            for name, param in model.named_parameters():
                if "text_model" not in name and name.endswith(_MATRICES):
                    param.copy_(param.to(rounded).float())
        out = model.get_image_features(tiles[None]).pooler_output[0]
    return out.view(len(tiles), tiny.TOKENS_PER_TILE, -1)


def test_folder_encoder_equals_transformers(folder, tiles):
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    assert encoder.tokens_per_image == tiny.TOKENS_PER_TILE == 16
    assert encoder.image_shape == [3, tiny.TILE, tiny.TILE]
    assert encoder.hidden_size == 64
    got = encoder(tiles)
    want = _features(folder, tiles)
    assert got.dtype == torch.float32 and got.shape == want.shape == (5, 16, 64)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # each tile on its own = in the batch (the engine encodes whatever tiles a step brings)
    torch.testing.assert_close(encoder(tiles[2:3]), got[2:3], atol=1e-5, rtol=0)
    assert "smolvlm" in encoder.describe() and "16 tokens per 64px tile" in encoder.describe()


def test_mmproj_f32_equals_transformers(folder, tiles, tmp_path):
    path = tiny.smolvlm_mmproj_gguf(folder, tmp_path / "mmproj-f32.gguf", "f32")
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    assert (encoder.tokens_per_image, encoder.image_shape) == (16, [3, 64, 64])
    torch.testing.assert_close(encoder(tiles), _features(folder, tiles), atol=ATOL, rtol=0)


@pytest.mark.parametrize("ftype,to", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_mmproj_16bit_equals_transformers_on_rounded_weights(folder, tiles, tmp_path, ftype,
                                                             to):
    """The converter's 16-bit matrices: the same as transformers with those weights rounded;
    kept in 16 bits (BlockLinear) where the native kernels load."""
    path = tiny.smolvlm_mmproj_gguf(folder, tmp_path / f"mmproj-{ftype}.gguf", ftype)
    encoder = load_vision_encoder(str(path), str(path), CPU, torch.float32)
    torch.testing.assert_close(encoder(tiles), _features(folder, tiles, to), atol=1e-3, rtol=0)
    if native.load() is not None:
        stored = {t for m in encoder.modules() if isinstance(m, BlockLinear) for t in m.types}
        assert stored == {ftype.upper()}


def test_mmproj_q8_0_runs_as_stored_close_to_transformers(folder, tiles, tmp_path):
    """Q8_0 matrices (weights and activations in 8 bits where run as stored): within 2% of
    the features' scale of transformers' float32 (a wrong name or layout is off by ~100%)."""
    path = tiny.smolvlm_mmproj_gguf(folder, tmp_path / "mmproj-q8_0.gguf", "q8_0")
    got = load_vision_encoder(str(path), str(path), CPU, torch.float32)(tiles)
    want = _features(folder, tiles)
    assert (got - want).abs().max() < 0.02 * want.abs().max()


def test_full_tile_positions_are_transformers_buckets():
    """The position rows of a full tile = transformers' bucketed fractional grid, including
    sizes where float32 rounding moves patches off 0..n²-1 (19 x 19; the releases' 32 x 32
    and 27 x 27 are the identity)."""
    from transformers import SmolVLMVisionConfig
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMVisionEmbeddings

    moved = 0
    for side in (8, 19, 27, 32):
        emb = SmolVLMVisionEmbeddings(SmolVLMVisionConfig(image_size=side * 2, patch_size=2,
                                                          hidden_size=1))
        with torch.no_grad():
            emb.patch_embedding.weight.zero_()
            emb.patch_embedding.bias.zero_()
            emb.position_embedding.weight.copy_(torch.arange(side * side,
                                                             dtype=torch.float32)[:, None])
            mask = torch.ones(1, side, side, dtype=torch.bool)
            want = emb(torch.zeros(1, 3, side * 2, side * 2), mask)[0, :, 0].long()
        got = full_tile_position_ids(side)
        assert torch.equal(got, want), side
        moved += not torch.equal(got, torch.arange(side * side))
    assert moved == 1  # 19 x 19 exercises the rounding


def test_text_config_is_the_text_config_and_the_gguf_says_the_same(folder, text_files):
    hf = load_model_config(ModelSource.resolve(str(folder)))
    assert hf.architecture == ARCH
    assert (hf.num_layers, hf.hidden_size, hf.num_heads, hf.num_kv_heads) == (2, 64, 4, 2)
    assert hf.vocab_size == 397 and not hf.tie_word_embeddings
    assert hf.rope_theta == 100_000.0
    gg = load_model_config(ModelSource.resolve(str(text_files["F32"])))
    assert gg.architecture == "LlamaForCausalLM"
    assert (gg.num_layers, gg.hidden_size, gg.vocab_size, gg.rope_theta) == (
        2, 64, 397, 100_000.0)


def test_a_text_config_without_heads_reads_as_transformers_reads_it():
    """SmolVLM2 releases' text_config leaves num_attention_heads out: LlamaConfig's 32."""
    from transformers import SmolVLMConfig

    text = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_key_value_heads": 3, "vocab_size": 49280}
    ours = smolvlm_hf_config({"architectures": [ARCH], "text_config": text}, ARCH)
    want = SmolVLMConfig(text_config=text).text_config
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        want.num_attention_heads, want.num_key_value_heads, want.head_dim)
    assert (ours.hidden_size, ours.num_layers, ours.vocab_size) == (576, 30, 49280)


def test_other_text_models_are_refused():
    with pytest.raises(ValueError, match="unsupported SmolVLM text model 'mistral'"):
        smolvlm_hf_config({"text_config": {"model_type": "mistral"}}, ARCH)
    with pytest.raises(ValueError, match="needs a text_config"):
        smolvlm_hf_config({}, ARCH)


def test_folder_logits_equal_transformers_without_reading_the_vision_tower(
        folder, reference, monkeypatch):
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
    runner = runner_for(folder)
    monkeypatch.undo()
    assert read and not [n for n in read if "vision_model" in n or "connector" in n]
    tokens = prompts(runner.config.vocab_size, (30, 11), seed=1)
    paged = Paged(tokens, 4)
    ours = runner.all_logits([paged.chunk(i, len(t)) for i, t in enumerate(tokens)])
    for t, logits in zip(tokens, ours):
        torch.testing.assert_close(logits, hf_logits(reference, t), atol=ATOL, rtol=0)


def test_gguf_f32_logits_equal_transformers(text_files, reference):
    runner = runner_for(text_files["F32"])
    tokens = prompts(runner.config.vocab_size, (19,), seed=2)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 19)])[0]
    torch.testing.assert_close(ours, hf_logits(reference, tokens[0]), atol=ATOL, rtol=0)


def test_gguf_q8_0_as_stored_is_close_to_transformers(text_files, reference):
    runner = runner_for(text_files["Q8_0"], quantization="gguf" if native.load() else "none")
    tokens = prompts(runner.config.vocab_size, (23,), seed=3)
    ours = runner.all_logits([Paged(tokens, 4).chunk(0, 23)])[0]
    diff = (ours - hf_logits(reference, tokens[0])).abs()
    assert diff.mean() < 0.15, diff.mean()  # a wrong name or rope is off by the logits' std


@pytest.mark.parametrize("which", ["folder", "F32"])
def test_llm_greedy_equals_transformers_generate(which, folder, text_files, reference):
    """A user's run: ``LLM`` on the folder or the text GGUF, a chat prompt in SmolVLM's
    template; the prompt's tokens are the folder tokenizer's, the greedy ones transformers'
    ``generate``."""
    from transformers import AutoTokenizer

    from radixserve import LLM, SamplingParams

    path = folder if which == "folder" else text_files[which]
    llm = LLM(str(path), show_progress=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]}],
        add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>User: Why is the sky blue?<end_of_utterance>\nAssistant:"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10,
                                              ignore_eos=True))[0]
    ids = out.prompt_token_ids
    assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        want = reference.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                  min_new_tokens=10)
    assert out.outputs[0].token_ids == want[0, len(ids):].tolist()
    assert len(set(out.outputs[0].token_ids)) > 1  # not one token over and over


def test_image_specials_are_single_tokens_through_either_tokenizer(folder, text_files):
    """``<fake_token_around_image>``, ``<row_i_col_j>``, ``<global-img>``, ``<image>``: one
    id each, the config's image id for ``<image>``, the same through the GGUF's tokenizer,
    and spelled back so (what the processor's tile prompt is made of)."""
    from transformers import AutoConfig, AutoTokenizer

    image_id = AutoConfig.from_pretrained(folder).image_token_id
    reference = AutoTokenizer.from_pretrained(folder)
    text = (f"x{tiny.FAKE}<row_1_col_2>{tiny.IMAGE}{tiny.IMAGE}{tiny.FAKE}"
            f"{tiny.GLOBAL}{tiny.IMAGE}{tiny.FAKE}<row_3_col_3> y")
    by_folder = load_tokenizer(ModelSource.resolve(str(folder)))
    by_file = load_tokenizer(ModelSource.resolve(str(text_files["Q8_0"])))
    ids = by_folder.encode(text, add_special_tokens=False)
    assert ids == by_file.encode(text, add_special_tokens=False)
    specials = [tiny.FAKE, "<row_1_col_2>", tiny.IMAGE, tiny.IMAGE, tiny.FAKE, tiny.GLOBAL,
                tiny.IMAGE, tiny.FAKE, "<row_3_col_3>"]
    want = reference.convert_tokens_to_ids(specials)
    assert ids == reference(text, add_special_tokens=False)["input_ids"]
    start = ids.index(want[0])
    assert ids[start:start + 9] == want and want[2] == image_id
    assert by_file.convert_ids_to_tokens(want) == specials
    assert ids.count(image_id) == 3


def _tile_prompt(tokenizer, num_tiles: int) -> list[int]:
    """Text, then per tile ``<fake_token_around_image><row_1_col_j>`` + the tile's
    ``<image>`` run, the last one ``<global-img>``, then text (the processor's spelling)."""
    parts = ["User:"]
    for j in range(num_tiles):
        label = tiny.GLOBAL if j == num_tiles - 1 else f"<row_1_col_{j + 1}>"
        parts.append(tiny.FAKE + label + tiny.IMAGE * tiny.TOKENS_PER_TILE)
    parts.append(f"{tiny.FAKE}What is in it?{tiny.EOS}\nAssistant:")
    return tokenizer("".join(parts), add_special_tokens=False)["input_ids"]


def test_text_model_splices_each_tile_as_transformers_merges_it(folder, reference, tiles):
    """The engine's path for an image: the Llama text model takes each tile's encoder rows
    over its ``<image>`` run (one ``ImageInput`` a tile, runner/image_embeds.py), fed in
    chunks that cut a tile in two: logits = transformers' forward with ``pixel_values``."""
    import hashlib

    from transformers import AutoTokenizer

    from radixserve.messages import ImageInput
    from radixserve.runner.image_embeds import ImageEmbeds

    tokenizer = AutoTokenizer.from_pretrained(folder)
    image_id = reference.config.image_token_id
    ids = _tile_prompt(tokenizer, 3)
    runner = runner_for(folder)
    encoder = load_vision_encoder(str(folder), None, CPU, torch.float32)
    runner.images = ImageEmbeds(encoder, CPU, bidirectional=frozenset(), max_chunk=512)
    starts = [i for i, t in enumerate(ids) if t == image_id and ids[i - 1] != image_id]
    images = [ImageInput(offset=s, length=tiny.TOKENS_PER_TILE,
                         key=hashlib.sha256(tiles[j].numpy().tobytes()).digest(),
                         pixels=tiles[j].numpy().tobytes(), shape=[3, tiny.TILE, tiny.TILE])
              for j, s in enumerate(starts)]
    runner.images.check(images, len(ids))
    paged, got = Paged([ids], 4), []
    for n in (starts[1] + 5, len(ids) - starts[1] - 5):  # the second tile in two chunks
        seq = paged.chunk(0, n)
        seq.images = [im for im in images if im.offset < seq.start_pos + n
                      and im.offset + im.length > seq.start_pos]
        got.append(runner.all_logits([seq])[0])
    with torch.inference_mode():
        want = reference(input_ids=torch.tensor([ids]), pixel_values=tiles[None, :3]).logits[0]
    torch.testing.assert_close(torch.cat(got), want, atol=ATOL, rtol=0)
    assert runner.images.stats.num_images_encoded == 3
    # the same prompt without the splice is another model's answer: the rows were used
    plain = runner_for(folder).all_logits([Paged([ids], 4).chunk(0, len(ids))])[0]
    assert (plain[starts[0]:] - want[starts[0]:]).abs().max() > 0.1
