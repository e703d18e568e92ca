"""BERT-style cross-encoders through the engine core (engine/encoder_build.py): tiny random
BertForSequenceClassification and XLMRobertaForSequenceClassification folders score pairs as
transformers does (sigmoid of the logit on the tokenizer's pair encoding, long pairs cut as
sentence-transformers cuts them), a pair's score is the same alone and in a batch of 16 of
other lengths, pairs are scheduled whole, and what an encoder cannot do is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from radixserve import LLM
from radixserve.frontend.cross_encoder import CrossEncoderReranker, resolve_task
from radixserve.messages import EngineCoreRequest
from radixserve.models.cross_encoder_config import cross_encoder_config
from radixserve.models.source import ModelSource
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_cross_encoders import MAX_LEN, WORDS, make_cross_encoder, reference_scores  # noqa: E402

KINDS = ("bert", "xlm-roberta")
PAIRS = [("what is the capital of china?", "beijing is a large city in northern china."),
         ("what is the capital of china?", "the capital of france is paris."),
         ("where do horses live", "horses and cows are both animals"),
         ("query", "document " + " ".join(WORDS * 4))]  # cut to MAX_LEN tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cross_encoders")
    return {kind: make_cross_encoder(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def llms(folders):
    made = {kind: LLM(str(path), show_progress=False, max_num_batched_tokens=MAX_LEN)
            for kind, path in folders.items()}
    yield made
    for llm in made.values():
        llm.close()


def _encoder(path: Path) -> CrossEncoderReranker:
    source = ModelSource.resolve(str(path))
    return CrossEncoderReranker.for_folder(source.path, cross_encoder_config(source), 10**6)


def _scores(llm, encoder, pairs) -> tuple[list[float], list[int]]:
    """Every pair queued at once, stepped to the end: (scores, pairs per step)."""
    core = llm.engine
    for i, (ids, start) in enumerate(encoder.encode_pairs(pairs)):
        core.add_request(EngineCoreRequest(request_id=f"p-{i}", prompt_token_ids=ids,
                                           sampling_params=SamplingParams(),
                                           pooling_params=encoder.pooling(start)))
    got, per_step = {}, []
    while core.has_unfinished_requests():
        outputs = core.step().outputs
        per_step.append(len(outputs))
        for out in outputs:
            assert out.error is None and out.finish_reason == "stop", out
            got[int(out.request_id.split("-")[1])] = encoder.relevance(out.pooled)
        core.scheduler.check_integrity()
    return [got[i] for i in range(len(pairs))], per_step


@pytest.mark.parametrize("kind", KINDS)
def test_scores_equal_transformers(kind, folders, llms):
    encoder = _encoder(folders[kind])
    assert encoder.max_len == MAX_LEN
    assert [len(ids) for ids, _ in encoder.encode_pairs(PAIRS)][-1] == MAX_LEN
    got, _ = _scores(llms[kind], encoder, PAIRS)
    assert got == pytest.approx(reference_scores(folders[kind], PAIRS), abs=1e-4)
    assert len(set(round(s, 4) for s in got)) == len(got)  # not a constant


@pytest.mark.parametrize("kind", KINDS)
def test_a_pair_alone_equals_it_in_a_batch_of_16(kind, folders, llms):
    encoder = _encoder(folders[kind])
    pairs = [(f"what is {WORDS[i]}", " ".join(WORDS[i:i + 2 + 3 * i])) for i in range(16)]
    assert len({len(ids) for ids, _ in encoder.encode_pairs(pairs)}) > 8
    llm = llms[kind]
    batched, per_step = _scores(llm, encoder, pairs)
    for i in (0, 7, 15):
        alone, _ = _scores(llm, encoder, [pairs[i]])
        assert alone[0] == pytest.approx(batched[i], abs=1e-5)
    assert per_step[0] > 1  # they were batched


def test_pairs_are_scheduled_whole(folders, llms):
    """With a step budget of one full pair (MAX_LEN tokens), two pairs of 40 tokens run in
    two steps, not as chunks."""
    encoder = _encoder(folders["bert"])
    pairs = [("query " * 10, "document " * 27)] * 2
    assert [len(ids) for ids, _ in encoder.encode_pairs(pairs)] == [40, 40]
    got, per_step = _scores(llms["bert"], encoder, pairs)
    assert per_step == [1, 1] and got[0] == pytest.approx(got[1], abs=1e-6)


def test_what_an_encoder_refuses(folders, llms):
    core = llms["bert"].engine
    with pytest.raises(ValueError, match="cross-encoder"):
        core.add_request(EngineCoreRequest(request_id="g", prompt_token_ids=[2, 5, 3],
                                           sampling_params=SamplingParams()))
    with pytest.raises(ValueError, match="cross-encoder"):
        core.add_request(EngineCoreRequest(request_id="e", prompt_token_ids=[2, 5, 3],
                                           sampling_params=SamplingParams(),
                                           pooling_params=PoolingParams()))
    with pytest.raises(ValueError, match=f"reads 1 to {MAX_LEN}"):
        core.add_request(EngineCoreRequest(
            request_id="long", prompt_token_ids=[5] * (MAX_LEN + 1),
            sampling_params=SamplingParams(), pooling_params=PoolingParams(pooling="classify")))
    assert not core.has_unfinished_requests()
    with pytest.raises(ValueError, match="second_segment_start"):
        PoolingParams(second_segment_start=3)
    with pytest.raises(ValueError, match="must be one of"):
        PoolingParams(pooling="cls")


def test_config_and_task(folders, tmp_path):
    source = ModelSource.resolve(str(folders["xlm-roberta"]))
    config = cross_encoder_config(source)
    assert config.max_len == MAX_LEN and not config.uses_token_types
    assert resolve_task(source, "auto") == resolve_task(source, "rerank") == "rerank"
    with pytest.raises(ValueError, match="not embeddings"):
        resolve_task(source, "embed")
    assert cross_encoder_config(ModelSource.resolve(None)) is None  # the embedded GGUF
    two = tmp_path / "two-labels"
    two.mkdir()
    cfg = json.loads((folders["bert"] / "config.json").read_text())
    cfg["id2label"] = {"0": "NO", "1": "YES"}
    (two / "config.json").write_text(json.dumps(cfg))
    (two / "model.safetensors").write_bytes((folders["bert"] / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="2 labels is a classifier"):
        cross_encoder_config(ModelSource.resolve(str(two)))
