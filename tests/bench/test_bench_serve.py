"""``radixserve bench serve | render | plot``: datasets, summary math, and end-to-end runs
against a real ``radixserve serve --mock-engine`` (no model: instant prefill, one random token
per step), plus a run against a closed port."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from radixserve.__main__ import main
from radixserve.bench import datasets as ds
from radixserve.bench.metrics import (
    RequestRecord, cache_counters, parse_prometheus, percentile, summarize)

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from server_proc import ServerProc, free_port

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def mock_server():
    # 2 ms steps, as a (fast) model would take: the client sees tokens arrive apart
    s = ServerProc("--mock-engine", "--mock-step-ms", "2", timeout=120)
    yield s
    assert s.stop() == 0


# --- datasets ----------------------------------------------------------------------------------


def test_random_dataset_counts_lengths_and_seed():
    convs = ds.random_dataset(10, 50, 7, seed=3)
    assert len(convs) == 10 and [c.index for c in convs] == list(range(10))
    assert all(len(c.turns) == 1 and c.turns[0].output_len == 7 for c in convs)
    assert all(len(c.turns[0].text.split()) == 50 for c in convs)
    assert all(w in ds.VOCAB for w in convs[0].turns[0].text.split())
    assert len({c.turns[0].text for c in convs}) == 10
    assert ds.random_dataset(10, 50, 7, seed=3) == convs
    assert ds.random_dataset(10, 50, 7, seed=4) != convs
    assert len(ds.random_dataset(1, 50, 7, words_per_token=0.5)[0].turns[0].text.split()) == 25


def test_shared_prefix_dataset_shares_prefixes():
    convs = ds.shared_prefix_dataset(3, 4, prefix_len=40, suffix_len=5, output_len=8, seed=1)
    assert len(convs) == 12
    groups: dict[str, set[str]] = {}
    for c in convs:
        text = c.turns[0].text.split()
        assert len(text) == 45
        groups.setdefault(c.tag, set()).add(" ".join(text[:40]))
    assert sorted(groups) == ["group0", "group1", "group2"]
    assert all(len(prefixes) == 1 for prefixes in groups.values())  # shared within a group
    assert len(set().union(*groups.values())) == 3  # distinct across groups
    assert [c.tag for c in convs] != sorted(c.tag for c in convs)  # interleaved


def test_multi_turn_dataset_and_history_growth(mock_server, tmp_path):
    convs = ds.multi_turn_dataset(2, 3, input_len=10, output_len=4, seed=0)
    assert [len(c.turns) for c in convs] == [3, 3]
    assert len({t.text for c in convs for t in c.turns}) == 6
    out = tmp_path / "mt.json"
    assert _bench(mock_server, "--dataset", "multi-turn", "--num-conversations", "2",
                  "--turns", "3", "--input-len", "10", "--output-len", "4",
                  "--result-json", str(out)) == 0
    records = json.loads(out.read_text())["records"]
    assert len(records) == 6 and all(r["ok"] for r in records)
    for conv in (0, 1):
        prompts = [r["prompt_tokens"] for r in records if r["conversation"] == conv]
        # each turn resends the history: +1 user message (10 words) and the 4-token answer
        assert prompts[0] < prompts[1] < prompts[2]
        assert prompts[2] - prompts[1] >= 14


def test_mixed_dataset_proportions():
    convs = ds.mixed_dataset(100, 20, short=0.3, normal=0.5, long=0.2, seed=0)
    tags = [c.tag for c in convs]
    assert {t: tags.count(t) for t in set(tags)} == {"short": 30, "normal": 50, "long": 20}
    assert {c.tag: c.turns[0].output_len for c in convs} == ds.MIXED_OUTPUT_LENS
    assert sum(1 for _ in ds.mixed_dataset(7, 5, 1, 1, 1)) == 7  # largest remainder
    with pytest.raises(ValueError):
        ds.mixed_dataset(10, 5, 0, 0, 0)


def test_arrival_times():
    assert ds.arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    times = ds.arrival_times(2000, 10.0, burstiness=0.5, seed=1)
    assert times == sorted(times) and times[0] == 0.0
    assert 150 < times[-1] < 250  # mean gap 0.1 s
    assert times == ds.arrival_times(2000, 10.0, burstiness=0.5, seed=1)
    with pytest.raises(ValueError):
        ds.arrival_times(1, 0.0)


# --- summary math ------------------------------------------------------------------------------


def test_percentile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert math.isclose(percentile(xs, 90), 3.7)
    assert math.isnan(percentile([], 50))


def test_summarize_hand_made_records():
    recs = [RequestRecord(ok=True, ttft=0.1, itl=[0.01, 0.03], e2e=0.5, output_tokens=5,
                          prompt_tokens=100, cached_tokens=50, usage=True),
            RequestRecord(ok=True, ttft=0.3, itl=[0.02], e2e=0.7, output_tokens=3,
                          prompt_tokens=100, cached_tokens=0, usage=True),
            RequestRecord(ok=False, error="HTTP 500: boom")]
    s = summarize(recs, duration=2.0, cache=(400.0, 100.0))
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 4.0 and s["total_token_throughput"] == 104.0
    assert math.isclose(s["ttft_ms"]["mean"], 200) and math.isclose(s["ttft_ms"]["p50"], 200)
    assert math.isclose(s["ttft_ms"]["p99"], 298)
    assert math.isclose(s["itl_ms"]["mean"], 20) and math.isclose(s["itl_ms"]["p50"], 20)
    assert math.isclose(s["tpot_ms"]["mean"], (100 + 200) / 2)  # (0.4/4, 0.4/2) s
    assert math.isclose(s["e2e_ms"]["p50"], 600)
    assert s["cache_hit_rate_server"] == 0.25 and s["cache_hit_rate_usage"] == 0.25
    assert s["errors"] == {"HTTP 500: boom": 1}


def test_prometheus_cache_counters():
    text = ("# TYPE radixserve:prefix_cache_hits_total counter\n"
            'radixserve:prefix_cache_hits_total{model_name="m"} 30.0\n'
            'radixserve:prefix_cache_queries_total{model_name="m"} 100.0\n'
            'radixserve:prefix_cache_queries_total{model_name="n"} 20.0\n')
    assert cache_counters(parse_prometheus(text)) == (120.0, 30.0)
    assert cache_counters(parse_prometheus("other_metric 1\n")) is None


# --- end to end --------------------------------------------------------------------------------


def _bench(server: ServerProc | None, *args: str, url: str | None = None) -> int:
    return main(["bench", "serve", "--base-url", url or server.url, "--no-progress",
                 "--ignore-eos", *args])


def test_bench_serve_end_to_end(mock_server, tmp_path, capsys):
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    assert _bench(mock_server, "--dataset", "random", "--num-prompts", "20", "--concurrency",
                  "4", "--input-len", "64", "--output-len", "8", "--result-json", str(out),
                  "--plot", str(png), "--label", "mock") == 0
    table = capsys.readouterr().out
    assert "TTFT" in table and "Output tokens/s" in table
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (20, 0)
    assert s["output_tokens"] == 20 * 8 and s["output_throughput"] > 0
    assert s["ttft_ms"]["mean"] > 0 and s["e2e_ms"]["p99"] >= s["ttft_ms"]["p99"]
    assert result["config"]["concurrency"] == 4 and result["label"] == "mock"
    assert len(result["records"]) == 20
    # a chunk may carry several tokens (a split character; a client that falls behind the
    # engine gets the waiting tokens merged): at most 7 gaps, possibly none
    assert all(r["ttft"] > 0 and r["usage"] and len(r["itl"]) <= 7 for r in result["records"])
    assert sum(len(r["itl"]) for r in result["records"]) > 0
    assert png.read_bytes()[:8] == PNG_MAGIC

    # a second run at another concurrency, then the comparison plot (CDFs + sweep)
    out2, cmp = tmp_path / "run2.json", tmp_path / "cmp.png"
    assert _bench(mock_server, "--dataset", "shared-prefix", "--num-groups", "2",
                  "--prompts-per-group", "3", "--prefix-len", "64", "--suffix-len", "4",
                  "--output-len", "4", "--concurrency", "2", "--endpoint", "completions",
                  "--label", "mock", "--result-json", str(out2)) == 0
    assert json.loads(out2.read_text())["summary"]["completed"] == 6
    assert main(["bench", "plot", str(out), str(out2), "--out", str(cmp)]) == 0
    assert cmp.read_bytes()[:8] == PNG_MAGIC


def test_bench_serve_closed_port_counts_failures(tmp_path):
    out = tmp_path / "fail.json"
    rc = _bench(None, "--num-prompts", "5", "--concurrency", "2", "--output-len", "4",
                "--result-json", str(out), url=f"http://127.0.0.1:{free_port()}")
    assert rc == 1  # ran to the end, nothing completed
    s = json.loads(out.read_text())["summary"]
    assert (s["completed"], s["failed"]) == (0, 5)
    assert all("Connect" in message for message in s["errors"])


def test_bench_serve_bad_arguments_exit_2(capsys):
    assert main(["bench", "serve", "--num-prompts", "0"]) == 2
    assert main(["bench", "serve", "--concurrency", "0"]) == 2
    assert "must be" in capsys.readouterr().err


def test_bench_render(mock_server, tmp_path, capsys):
    out = tmp_path / "render.json"
    assert main(["bench", "render", "--base-url", mock_server.url, "--concurrency", "1,4",
                 "--num-requests", "10", "--result-json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {(r["shape"], r["concurrency"]) for r in rows} == {
        (shape, c) for shape in ("short", "long", "tools") for c in (1, 4)}
    for r in rows:
        assert (r["completed"], r["failed"]) == (10, 0)
        assert r["requests_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
    tokens = {r["shape"]: r["tokens"] for r in rows}
    assert tokens["long"] > 2000 > tokens["short"]
    assert "short" in capsys.readouterr().out


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bench_serve_through_ollama_routes(mock_server, tmp_path, endpoint):
    """--api ollama: the same workload through /api/chat (or raw /api/generate), its NDJSON
    lines counted like SSE chunks, its final line's counts as usage."""
    out = tmp_path / f"ollama-{endpoint}.json"
    assert _bench(mock_server, "--api", "ollama", "--endpoint", endpoint, "--num-prompts", "6",
                  "--concurrency", "3", "--input-len", "32", "--output-len", "8",
                  "--result-json", str(out)) == 0
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (6, 0) and s["output_tokens"] == 6 * 8
    assert all(r["usage"] and r["ttft"] > 0 for r in result["records"])


@pytest.mark.parametrize("api", ["responses"])
def test_bench_serve_through_another_api(mock_server, tmp_path, api):
    out = tmp_path / f"{api}.json"
    assert _bench(mock_server, "--api", api, "--dataset", "multi-turn",
                  "--num-conversations", "3", "--turns", "2", "--input-len", "16",
                  "--output-len", "6", "--concurrency", "3", "--result-json", str(out)) == 0
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (6, 0)
    assert s["output_tokens"] == 6 * 6
    records = result["records"]
    assert all(r["usage"] and r["ttft"] > 0 for r in records)
    # a second turn's prompt holds the first turn and its answer
    by_conv = {}
    for r in records:
        by_conv.setdefault(r["conversation"], []).append(r["prompt_tokens"])
    assert all(second > first + 6 for first, second in by_conv.values())


def test_bench_serve_through_the_messages_api(mock_server, tmp_path):
    out = tmp_path / "messages.json"
    assert _bench(mock_server, "--api", "messages", "--dataset", "multi-turn",
                  "--num-conversations", "3", "--turns", "2", "--input-len", "8",
                  "--output-len", "5", "--ignore-eos", "--result-json", str(out)) == 0
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (6, 0) and s["output_tokens"] == 6 * 5
    records = result["records"]
    assert all(r["usage"] and r["ttft"] > 0 and r["prompt_tokens"] > 0 for r in records)
    # the second turn carries the first's answer: a longer prompt
    assert all(b["prompt_tokens"] > a["prompt_tokens"] for a, b in zip(records, records[1:])
               if a["conversation"] == b["conversation"])
