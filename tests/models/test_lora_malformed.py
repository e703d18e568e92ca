"""Malformed LoRA adapters (issue 62 item 2): the torch-free check the API process runs names
each problem; the engine refuses each one as a failed load (a 400 reply) and goes on serving,
even when a load fails in a way no check foresaw."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from malformed_lora import malformed_adapters, write_peft_adapter
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.engine.core_proc import _lora_call
from radixserve.messages import LoraAdapterCall
from radixserve.models.lora_check import check_lora_adapter, lora_base_config

PROMPT = [5, 17, 33, 101, 7, 250, 9, 64, 12]
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_malformed")
    base = make_hf_model("llama", root / "base", seed=3)
    c = json.loads((base / "config.json").read_text())
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    good = write_peft_adapter(root / "good", c["hidden_size"],
                              c["num_attention_heads"] * head_dim,
                              c["num_key_value_heads"] * head_dim, c["num_hidden_layers"])
    return base, good, malformed_adapters(good, root / "bad")


def test_the_check_names_each_problem(setup):
    base, good, cases = setup
    cfg = lora_base_config(str(base))
    check_lora_adapter(str(good), cfg)
    for name, (path, fragment) in cases.items():
        with pytest.raises(ValueError) as info:
            check_lora_adapter(str(path), cfg)
        assert fragment in str(info.value), (name, str(info.value))


def test_the_check_loads_no_torch(setup):
    base, good, _ = setup
    code = ("import sys; from radixserve.models.lora_check import check_lora_adapter, "
            f"lora_base_config as b; check_lora_adapter({str(good)!r}, b({str(base)!r})); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.stdout.split() == ["False"], out.stderr


def test_the_engine_refuses_each_and_serves_on(setup):
    base, good, cases = setup
    llm = LLM(str(base), num_kv_blocks=64, show_progress=False)
    plain = llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    for name, (path, fragment) in cases.items():
        reply = _lora_call(llm.engine, LoraAdapterCall(name, str(path)))
        assert reply.status == 400 and fragment in reply.error, (name, reply)
        with pytest.raises(ValueError, match="."):
            llm.load_lora(name, str(path))  # offline too: a ValueError, never a KeyError
    assert llm.engine.loras.names == []
    assert _lora_call(llm.engine, LoraAdapterCall("good", str(good))).error is None
    tuned = llm.generate([PROMPT], GREEDY, lora="good")[0].outputs[0].token_ids
    assert llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids == plain
    assert len(tuned) == len(plain)


def test_an_unforeseen_failure_fails_that_load_alone(setup, monkeypatch):
    base, good, _ = setup
    llm = LLM(str(base), num_kv_blocks=64, show_progress=False)

    def broken(lora_id, path):
        raise RuntimeError("out of adapter memory")

    monkeypatch.setattr(llm.engine.loras.runner, "add_lora", broken)
    reply = _lora_call(llm.engine, LoraAdapterCall("good", str(good)))
    assert reply.status == 400 and "RuntimeError: out of adapter memory" in reply.error
    assert llm.engine.loras.names == []
    monkeypatch.undo()
    assert _lora_call(llm.engine, LoraAdapterCall("good", str(good))).error is None
    assert llm.generate([PROMPT], GREEDY, lora="good")[0].outputs[0].token_ids
