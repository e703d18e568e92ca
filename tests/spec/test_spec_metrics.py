"""The speculative counters in /metrics and in bench serve's summary; the config checks."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from radixserve.bench.metrics import parse_prometheus, spec_counters, summarize
from radixserve.cli_args import add_engine_args, engine_kwargs
from radixserve.config import SpeculativeConfig, engine_config
from radixserve.core.reports import SchedulerStats
from radixserve.frontend.http.metrics import ServerMetrics


def test_metrics_expose_drafts_accepted_and_rate_per_position():
    stats = SchedulerStats(spec_num_drafts=10, spec_draft_tokens=23, spec_accepted_tokens=12,
                           spec_accepted_per_pos=[7, 4, 1], spec_drafted_per_pos=[10, 8, 5])
    m = ServerMetrics(SimpleNamespace(stats=stats, replicas=[SimpleNamespace(stats=stats)]),
                      "m", 4096)
    text = generate_latest(m.registry).decode()
    assert 'radixserve:spec_decode_acceptance_rate_per_pos{model_name="m",position="1"} 0.4' \
        in text
    assert 'radixserve:spec_decode_num_draft_tokens_per_pos_total{model_name="m",position="2"}' \
        ' 5.0' in text
    parsed = parse_prometheus(text)
    assert spec_counters(parsed) == (10.0, 23.0, 12.0)
    assert parsed["radixserve:spec_decode_num_accepted_tokens_per_pos_total"] == 12.0
    assert parsed["radixserve:spec_decode_num_draft_tokens_per_pos_total"] == 23.0
    summary = summarize([], 1.0, None, (10.0, 23.0, 12.0))
    assert summary["spec_mean_accepted_len"] == pytest.approx(2.2)
    assert summary["spec_acceptance_rate"] == pytest.approx(12 / 23)


def test_cli_flags_reach_the_config_and_bad_values_are_refused():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    args = p.parse_args(["--speculative", "ngram", "--num-speculative-tokens", "6"])
    spec = engine_config(**engine_kwargs(args)).speculative
    assert (spec.method, spec.num_speculative_tokens, spec.adaptive) == ("ngram", 6, True)
    with pytest.raises(ValueError, match="supported: off, ngram, suffix, auto, draft"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be in 1\.\.7"):
        SpeculativeConfig("ngram", 9)
