"""LoRA adapters: greedy output equal to transformers + peft and to the merged model; a batch
mixing adapters equal to each alone; PEFT and GGUF files giving the same output; mismatches
refused at load."""

from __future__ import annotations

import json
import shutil

import pytest

from tiny_lora import hf_greedy, hf_model, make_peft_adapter, merged_model, peft_to_gguf
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams

N = 8
PROMPTS = [[5, 17, 33, 101, 7, 250, 9, 64, 12], [300, 2, 44, 45, 46, 200, 13],
           [88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 120, 140, 160, 180, 200]]
GREEDY = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_hf_model("llama", root / "base", seed=3)
    a = make_peft_adapter(base, root / "a", seed=1)
    b = make_peft_adapter(base, root / "b", seed=2, r=4, alpha=8, targets=("q_proj", "v_proj"),
                          use_rslora=True)
    return root, base, a, b


def _llm(model, **kw) -> LLM:
    return LLM(str(model), num_kv_blocks=64, show_progress=False, **kw)


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_equals_transformers_peft_and_merged(setup):
    root, base, a, b = setup
    llm = _llm(base, lora_modules={"a": str(a), "b": str(b)})
    for name, adapter in (("a", a), ("b", b)):
        ours = _tokens(llm.generate(PROMPTS, GREEDY, lora=name))
        ref = hf_model(base, adapter)
        assert ours == [hf_greedy(ref, p, N) for p in PROMPTS], name
    base_ours = _tokens(llm.generate(PROMPTS, GREEDY))
    assert base_ours == [hf_greedy(hf_model(base), p, N) for p in PROMPTS]
    assert base_ours != _tokens(llm.generate(PROMPTS, GREEDY, lora="a"))  # it does something
    merged = _llm(merged_model(base, a, root / "merged"))
    assert _tokens(merged.generate(PROMPTS, GREEDY)) == _tokens(
        llm.generate(PROMPTS, GREEDY, lora="a"))


@pytest.mark.parametrize("fmt", ["hf", "gguf-q8"])
def test_mixed_batch_equals_alone(setup, tiny_gguf_files, fmt):
    """Rows of two adapters and none in one batch: each as alone; on the GGUF model the base
    runs the native layer stack, adapter steps the Python layers."""
    root, base, a, b = setup
    model = base if fmt == "hf" else _gguf(base, root)
    llm = _llm(model, lora_modules={"a": str(a), "b": str(b)}, enable_prefix_caching=False)
    names = ["a", None, "b"]
    mixed = _tokens(llm.generate(PROMPTS, GREEDY, lora=names))
    alone = [_tokens(llm.generate([p], GREEDY, lora=n))[0] for p, n in zip(PROMPTS, names)]
    assert mixed == alone
    stack = llm.engine.runner.model._stack
    assert type(stack.plain).__name__ == ("NativeLayerStack" if fmt == "gguf-q8"
                                          else "PythonLayerStack")
    plain = _llm(model)  # no adapter ever loaded: the plain path
    assert _tokens(plain.generate([PROMPTS[1]], GREEDY))[0] == mixed[1]


def _gguf(base, root):
    from tiny_models import hf_to_gguf

    out = root / "gguf" / "base-q8.gguf"
    return out if out.exists() else hf_to_gguf(base, out, "Q8_0")


def test_gguf_lora_file_equals_peft_folder(setup):
    root, base, a, _ = setup
    path = peft_to_gguf(a, base, root / "a.gguf")
    llm = _llm(base, lora_modules={"folder": str(a), "file": str(path)})
    assert _tokens(llm.generate(PROMPTS, GREEDY, lora="file")) == _tokens(
        llm.generate(PROMPTS, GREEDY, lora="folder"))


def test_prefix_cache_does_not_cross_adapters(setup):
    """The same prompt hits the cache only under the adapter that computed it; a name
    reloaded with other weights is a new adapter."""
    root, base, a, b = setup
    llm = _llm(base, lora_modules={"a": str(a)})
    kv = llm.engine.scheduler.kv
    prompt = PROMPTS[2] * 3  # several full pages

    def hits(lora) -> tuple[list[int], int]:
        before = kv.num_hit_tokens
        tokens = _tokens(llm.generate([prompt], GREEDY, lora=lora))[0]
        return tokens, kv.num_hit_tokens - before

    with_a, hit = hits("a")
    assert hit == 0
    assert hits(None)[1] == 0  # the base does not reuse the adapter's KV
    again, hit = hits("a")
    assert again == with_a and hit >= len(prompt) - 16
    assert hits(None)[1] >= len(prompt) - 16
    llm.unload_lora("a")
    llm.load_lora("a", str(b))
    assert hits("a")[1] == 0
    llm.engine.scheduler.check_integrity()


def test_mismatch_errors(setup, tmp_path):
    root, base, a, _ = setup
    other = make_hf_model("llama", tmp_path / "other", seed=4, hidden_size=48,
                          intermediate_size=96)
    wrong = make_peft_adapter(other, tmp_path / "wrong", seed=1)
    llm = _llm(base)
    with pytest.raises(ValueError, match="do not fit the base model"):
        llm.load_lora("wrong", str(wrong))
    bad_rank = tmp_path / "bad_rank"
    shutil.copytree(a, bad_rank)
    conf = json.loads((bad_rank / "adapter_config.json").read_text())
    conf["r"] = 3
    (bad_rank / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(ValueError, match="rank 8, the config says 3"):
        llm.load_lora("bad", str(bad_rank))
    with pytest.raises(FileNotFoundError):
        llm.load_lora("none", str(tmp_path / "missing"))
    qwen = peft_to_gguf(a, base, tmp_path / "qwen.gguf", arch="qwen2")
    with pytest.raises(ValueError, match="an adapter for a 'qwen2' model"):
        llm.load_lora("qwen", str(qwen))
    with pytest.raises(ValueError, match="no LoRA adapter named 'x'"):
        llm.generate(PROMPTS[:1], GREEDY, lora="x")
    llm.load_lora("a", str(a))
    with pytest.raises(ValueError, match="already loaded"):
        llm.load_lora("a", str(a))
    assert llm.engine.loras.names == ["a"]
