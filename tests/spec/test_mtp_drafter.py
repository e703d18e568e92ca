"""``--speculative mtp``: tiny Qwen3.5 models with an MTP block (the releases' ``mtp.*``).

- Every proposal the engine makes is the MTP block's greedy prediction computed from scratch
  with transformers' own pieces (a full-attention ``Qwen3_5DecoderLayer`` fed
  ``fc([norm(embed(next token)), norm(final hidden)])``, vLLM's Qwen3-Next / Qwen3.5 MTP):
  the first from the target's hidden states, the next from the block's own output, across
  steps whose drafts were rejected (the block's KV caught up over the kept positions only).
- Greedy output with MTP drafting = without speculation, from the folder and from the GGUF
  llama.cpp's converter writes (nextn tensors), batched and chunked; dense and MoE (whose
  block's MLP is a sparse MoE, experts fused as the releases store them).
- Which positions the block catches up on after a verified draft, with accepted tokens.
- A checkpoint without the block is refused with a clear error.
"""

from __future__ import annotations

import copy
import importlib
import random

import pytest
import torch
from tiny_hybrid import make_qwen35_hf_model, make_qwen35_moe_hf_model, qwen35_hf_to_gguf
from tiny_qwen3next import make_qwen3next_hf_model, qwen3next_hf_to_gguf

from radixserve import LLM, SamplingParams
from radixserve.core.sched_output import DraftResult, ModelRunnerOutput, MtpWork, ScheduledSeq
from radixserve.runner.draft_runner import TargetStep, emitted_tokens
from radixserve.runner.mtp_runner import MtpRunner

K = 3
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module", params=["dense", "moe"])
def hf_dir(request, tmp_path_factory):
    make = make_qwen35_hf_model if request.param == "dense" else make_qwen35_moe_hf_model
    return make(tmp_path_factory.mktemp("mtp") / "hf", seed=7, mtp=True)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (6, 19, 11)]


def _mtp_llm(path, **kw) -> LLM:
    return LLM(str(path), block_size=4, show_progress=False, speculative="mtp",
               num_speculative_tokens=K, speculative_adaptive=False, **kw)


class _Reference:
    """The MTP block with transformers' modules and the folder's ``mtp.*`` weights."""

    def __init__(self, hf_dir) -> None:
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        cfg = copy.deepcopy(self.model.config)
        module = cfg.model_type.removesuffix("_text")  # qwen3_5, qwen3_5_moe
        m = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        kind = type(self.model).__name__.removesuffix("ForCausalLM")
        n = cfg.num_hidden_layers
        cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
        state = {k[4:]: v.float() for k, v in load_file(str(hf_dir / "model.safetensors")).items()
                 if k.startswith("mtp.")}
        self.layer = getattr(m, f"{kind}DecoderLayer")(cfg, n).eval()
        self.layer.load_state_dict({k[9:]: v for k, v in state.items()
                                    if k.startswith("layers.0.")})
        eps, h = cfg.rms_norm_eps, cfg.hidden_size
        self.norms = {}
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            norm = getattr(m, f"{kind}RMSNorm")(h, eps)
            norm.weight.data.copy_(state[f"{name}.weight"])
            self.norms[name] = norm
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.fc.weight.data.copy_(state["fc.weight"])

    @torch.no_grad()
    def proposals(self, tokens: list[int], num_confirmed: int, k: int) -> list[int]:
        """The block's greedy ``k`` tokens after the first ``num_confirmed`` of ``tokens``."""
        known = tokens[:num_confirmed]
        ids = torch.tensor([known[:-1]])
        hidden = self.model.model(ids).last_hidden_state[0]  # final (normed) hidden states
        nxt, out = list(known[1:]), []
        for _ in range(k):
            mixed = self._block(nxt, hidden)
            out.append(int(self.model.lm_head(mixed[-1]).argmax()))
            hidden = torch.cat([hidden, mixed[-1:]])  # the block's own output fed back
            nxt.append(out[-1])
        return out

    def _block(self, nxt: list[int], hidden: torch.Tensor) -> torch.Tensor:
        embeds = self.model.model.embed_tokens(torch.tensor(nxt))
        x = self.fc(torch.cat([self.norms["pre_fc_norm_embedding"](embeds),
                               self.norms["pre_fc_norm_hidden"](hidden)], dim=-1))[None]
        positions = torch.arange(x.shape[1])[None]
        emb = self.model.model.rotary_emb(x, positions)
        x = self.layer(x, position_embeddings=emb, position_ids=positions)
        return self.norms["norm"](x)[0]


def _record_proposals(llm) -> list:
    """Wrap the engine's MTP runner: every step's proposals, as (request id, Proposal)."""
    drafter = llm.engine.runner.drafter
    assert isinstance(drafter, MtpRunner)
    seen, propose = [], drafter.propose

    def recording(step, out):
        propose(step, out)
        seen.extend(out.proposals.items())
    drafter.propose = recording
    return seen


def test_every_proposal_is_the_blocks_prediction(hf_dir):
    llm = _mtp_llm(hf_dir)
    seen = _record_proposals(llm)
    prompts = _prompts(llm.engine.vocab_size)
    outputs = llm.generate(prompts, GREEDY)
    full = {o.request_id: o.prompt_token_ids + o.outputs[0].token_ids for o in outputs}
    ref = _Reference(hf_dir)
    checked = 0
    for rid, proposal in seen:
        tokens = full[rid]
        if proposal.num_confirmed > len(tokens):
            continue  # proposed after the last token
        assert proposal.token_ids == ref.proposals(tokens, proposal.num_confirmed,
                                                   len(proposal.token_ids)), rid
        checked += 1
    assert checked >= 3 * len(prompts)  # every step proposed K tokens, rejected each time
    assert llm.engine.scheduler.spec.num_draft_tokens >= K * checked // 2


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_greedy_output_is_unchanged(hf_dir, tmp_path, kind):
    path = hf_dir if kind == "folder" else qwen35_hf_to_gguf(hf_dir, tmp_path / "q.gguf", "Q8_0")
    base = LLM(str(path), block_size=4, show_progress=False, speculative="off")
    prompts = _prompts(base.engine.vocab_size)
    expected = [o.outputs[0].token_ids for o in base.generate(prompts, GREEDY)]
    del base
    llm = _mtp_llm(path, max_num_batched_tokens=8)  # chunked prompts, batched decodes
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert llm.engine.scheduler.spec.num_draft_tokens > 0
    again = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]  # prefix hits
    assert again == expected


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_qwen3_next_drafts_with_its_block(tmp_path, kind):
    """Qwen3-Next's release carries the block (its config does not count it): it loads from
    the folder's ``mtp.*`` and the converter's nextn tensors, drafts, and greedy output is
    unchanged."""
    hf = make_qwen3next_hf_model(tmp_path / "hf", seed=2, mtp=True)
    path = hf if kind == "folder" else qwen3next_hf_to_gguf(hf, tmp_path / "n.gguf", "Q8_0")
    base = LLM(str(path), block_size=4, show_progress=False, speculative="off")
    prompts = _prompts(base.engine.vocab_size)
    expected = [o.outputs[0].token_ids for o in base.generate(prompts, GREEDY)]
    del base
    llm = _mtp_llm(path)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert llm.engine.scheduler.spec.num_draft_tokens > 0


def test_catch_up_feeds_the_kept_positions(monkeypatch):
    """A sequence that fed [5, d1, d2, d3] at 10..13 with d1, d2 accepted and 8 emitted after
    them: the block sees positions 10..12 with the tokens after each (d1, d2, 8) and the
    target's hidden rows there; a prompt chunk [1, 2] at 0 whose next prompt token is 3:
    positions 0, 1 with 2, 3."""
    runner = MtpRunner.__new__(MtpRunner)  # _feeds reads the step alone
    chunk = ScheduledSeq("p", [1, 2], 0, [0], False, mtp=MtpWork(3, 0))
    seq = ScheduledSeq("s", [5, 40, 41, 42], 10, [1, 2, 3, 4], True, num_draft=3,
                       mtp=MtpWork(None, 0))
    hidden = torch.arange(6.0)[:, None].repeat(1, 2)  # row i: i (chunk 0..1, seq 2..5)
    out = ModelRunnerOutput(["s"], [40], [None], [None],
                            {"s": DraftResult(3, 2, [41, 8], [None] * 2, [None] * 2)})
    feeds = runner._feeds(TargetStep([chunk, seq], hidden, [seq]), emitted_tokens(out))
    assert [(f.tokens, f.start, f.row) for f in feeds] == [([2, 3], 0, 0), ([40, 41, 8], 10, 2)]


def test_a_checkpoint_without_the_block_is_refused(tmp_path):
    path = make_qwen35_hf_model(tmp_path / "plain", seed=3)
    with pytest.raises(ValueError, match="holds no MTP block"):
        LLM(str(path), show_progress=False, speculative="mtp")
