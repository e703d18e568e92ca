"""The draft-model proposer through the whole engine path (``LLM(..., draft_model=)``, as
``--draft-model`` builds it) on tiny random models: a random draft (low acceptance) for a
random target gives the target's greedy output exactly; the vocabulary check; the flags."""

from __future__ import annotations

import argparse
import json

import pytest
from tiny_models import make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.cli_args import add_engine_args, engine_kwargs
from radixserve.config import SpeculativeConfig, engine_config
from radixserve.engine.draft_setup import check_draft_vocab
from radixserve.env_report import report
from radixserve.models.default import default_model_path
from radixserve.models.loader import load_model_config
from radixserve.models.source import ModelSource

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7], [40, 41, 42, 43] * 6, [100, 3, 7]]


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory):
    """A one-layer random llama with the tiny tokenizer (another seed than the target)."""
    return make_hf_model("llama", tmp_path_factory.mktemp("draft") / "d", seed=1,
                         num_hidden_layers=1)


def _llm(model, **kw):
    return LLM(str(model), num_kv_blocks=48, block_size=4, show_progress=False, **kw)


def test_random_draft_gives_the_targets_greedy_output(tiny_hf_dirs, tiny_draft_dir):
    target = tiny_hf_dirs["llama"]
    plain = _llm(target)
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY)]
    del plain
    llm = _llm(target, draft_model=str(tiny_draft_dir), speculative_adaptive=False,
               max_num_batched_tokens=16)  # chunked prompts too
    spec = llm.engine.scheduler.spec
    assert spec.proposer.name == "draft"
    assert llm.engine.runner.drafter.name == "d"
    step = llm.engine.step

    def checked_step():  # both pools' integrity after every step
        out = step()
        llm.engine.scheduler.check_integrity()
        return out

    llm.engine.step = checked_step
    # The second round: prefix-cache hits for the target (the draft computes the prefix),
    # and the draft's catch-up in forwards of at most 5 tokens.
    for max_chunk in (2048, 5):
        llm.engine.runner.drafter.max_chunk = max_chunk
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert got == want
        pool = spec.proposer.pool
        assert pool.num_free_blocks == pool.num_blocks  # every draft block back
    assert llm.engine.scheduler.kv.num_hit_tokens > 0
    assert 0 < spec.num_draft_tokens
    assert spec.num_accepted_tokens < spec.num_draft_tokens  # a random draft misses


def test_a_draft_with_another_vocabulary_is_refused(tiny_hf_dirs, tmp_path):
    target = tiny_hf_dirs["llama"]
    bigger = make_hf_model("llama", tmp_path / "big", seed=1, num_hidden_layers=1)
    config = json.loads((bigger / "config.json").read_text())  # refused before any weight
    (bigger / "config.json").write_text(json.dumps({**config, "vocab_size": 512}))
    with pytest.raises(ValueError, match=r"the draft model .*big and the target model .*"
                                         r"have different vocabularies: the draft's has 512"):
        _llm(target, draft_model=str(bigger))
    # the same size or smaller is not enough: the ids must mean the same tokens
    embedded = ModelSource.resolve(default_model_path())
    tiny = ModelSource.resolve(str(target))
    with pytest.raises(ValueError, match=r"different vocabularies: the draft's token 0 is"):
        check_draft_vocab(embedded, load_model_config(embedded), None, tiny,
                          load_model_config(tiny), None)


def test_env_reports_the_draft_model(tiny_hf_dirs, tiny_draft_dir):
    text = report(str(tiny_hf_dirs["llama"]), draft_model=str(tiny_draft_dir))
    assert (f"draft model (--speculative draft): {tiny_draft_dir} (LlamaForCausalLM, 1 layers, "
            "vocab 384") in text
    assert "KV pool: 33% of --kv-cache-memory-gb" in text  # 1 layer of the 3 both have


def test_draft_model_flag_implies_the_method_and_conflicts_are_refused():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_config(**engine_kwargs(p.parse_args([]))).speculative.method == "auto"
    assert engine_config().speculative.method == "auto"  # the default, for LLM(...) too
    args = p.parse_args(["--speculative", "off"])
    assert engine_config(**engine_kwargs(args)).speculative.method == "off"
    with pytest.raises(ValueError, match="only used by speculative method 'draft', not 'off'"):
        engine_config(**engine_kwargs(p.parse_args(["--speculative", "off",
                                                    "--draft-model", "d.gguf"])))
    spec = engine_config(**engine_kwargs(p.parse_args(["--draft-model", "d.gguf"]))).speculative
    assert (spec.method, spec.draft_model) == ("draft", "d.gguf")
    args = p.parse_args(["--speculative", "draft", "--draft-model", "d.gguf"])
    assert engine_config(**engine_kwargs(args)).speculative.method == "draft"
    with pytest.raises(ValueError, match="only used by speculative method 'draft', not 'ngram'"):
        engine_config(**engine_kwargs(p.parse_args(["--speculative", "ngram",
                                                    "--draft-model", "d.gguf"])))
    with pytest.raises(ValueError, match="'draft' needs a draft model"):
        SpeculativeConfig("draft")
