"""Bad models fail with a clear error before anything deep in torch."""

from __future__ import annotations

import json
import shutil

import pytest

from radixserve import LLM


def test_unknown_path():
    with pytest.raises(FileNotFoundError, match="model not found"):
        LLM("/no/such/model.gguf", show_progress=False)


def test_truncated_gguf(tiny_gguf_files, tmp_path):
    data = tiny_gguf_files("llama", "F32").read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a valid GGUF"):
        LLM(str(bad), show_progress=False)


def test_garbage_file(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"this is not a model at all" * 100)
    with pytest.raises(ValueError, match="not a valid GGUF"):
        LLM(str(bad), show_progress=False)


def test_unsupported_hf_architecture(tiny_hf_dirs, tmp_path):
    folder = tmp_path / "gpt2ish"
    shutil.copytree(tiny_hf_dirs["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported model architecture.*LlamaForCausalLM"
                                         ".*Qwen2MoeForCausalLM"):
        LLM(str(folder), show_progress=False)


def test_unsupported_gguf_architecture(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'falcon'.*llama.*qwen2moe"):
        LLM(str(path), show_progress=False)


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(tmp_path), show_progress=False)


def test_tiny_models_generate_from_both_formats(tiny_hf_dirs, tiny_gguf_files):
    from radixserve import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    hf = LLM(str(tiny_hf_dirs["qwen2"]), show_progress=False).generate("hello world", params)
    gg = LLM(str(tiny_gguf_files("qwen2", "F32")), show_progress=False).generate(
        "hello world", params)
    assert hf[0].outputs[0].token_ids == gg[0].outputs[0].token_ids
    assert hf[0].prompt_token_ids == gg[0].prompt_token_ids
