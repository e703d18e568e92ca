"""JSONSchemaBench against an OpenAI-compatible server: how many real-world schemas get an
answer that validates ("empirical coverage"), and why the others do not.

The benchmark's data is the ``data/`` folder of the guidance-ai/jsonschemabench repository,
fetched by the person running this (nothing is downloaded here, and no schema is copied into
the project). Every schema of a fixed sample (``--per-set`` per set, chosen with ``--seed``
from the sorted file names) goes to /v1/chat/completions as ``response_format: json_schema``,
greedy, within ``--max-tokens``; each answer is validated with ``jsonschema`` under the
schema's own draft. Per set and overall it prints:

* valid: the answer parses and validates;
* truncated: cut at max_tokens (finish_reason "length");
* unparsable / invalid: finished, but not JSON / not valid under the schema;
* refused: a 4xx (counted by the feature the message names), 5xx: server errors;
* p50 latency per request, and the wall time of the run.

``--url`` measures a server already running (llama-server's /v1 works the same; pass
``--model`` if it checks names); without it the script starts ``radixserve serve`` on the
embedded model. ``--compile`` also times the grammar compile of every sampled schema
in-process with radixserve's own backend and the embedded tokenizer (p50/p99, cold: no cache).

    .venv/bin/python benchmarks/jsonschemabench.py --data /path/to/jsonschemabench/data \\
        [--per-set 30] [--max-tokens 400] [--concurrency 8] [--url http://127.0.0.1:8080]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))

SYSTEM = "You answer with one JSON value and nothing else."
PROMPT_CHARS = 6000  # a longer schema is named, not shown (the grammar enforces it anyway)
_FEATURE = re.compile(r"(oneOf|anyOf|allOf|not|dependencies|dependentRequired|dependentSchemas|"
                      r"uniqueItems|propertyNames|patternProperties|format|if|\$ref|"
                      r"unevaluatedProperties|contains|minContains|maxContains|pattern|"
                      r"multipleOf|prefixItems|additionalItems|const|enum)")


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    return "unknown CPU"


def sample(data: Path, per_set: int, seed: int, sets: list[str] | None = None
           ) -> list[tuple[str, str, dict]]:
    """(set, file name, schema) for ``per_set`` schemas of each set that parse as JSON."""
    out = []
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        if sets and folder.name not in sets:
            continue
        names = sorted(p.name for p in folder.glob("*.json"))
        random.Random(seed).shuffle(names)
        taken = 0
        for name in names:
            if taken == per_set:
                break
            try:
                schema = json.loads((folder / name).read_text())
            except (ValueError, UnicodeDecodeError):
                continue
            out.append((folder.name, name, schema))
            taken += 1
    return out


def prompt(schema: dict) -> str:
    text = json.dumps(schema)
    if len(text) > PROMPT_CHARS:
        title = schema.get("title") or schema.get("description", "")[:200] or "the schema"
        return f"Generate a JSON value for {title}."
    return f"Generate a JSON value that follows this JSON schema:\n{text}"


def verdict(schema: dict, status: int, body: dict) -> tuple[str, str | None]:
    """(outcome, refused feature or None)."""
    if status >= 500:
        return "5xx", None
    if status >= 400:
        message = (body.get("error") or {}).get("message", "") if isinstance(body, dict) else ""
        found = _FEATURE.search(message)
        return "refused", found[1] if found else message[:60]
    choice = body["choices"][0]
    if choice.get("finish_reason") == "length":
        return "truncated", None
    try:
        value = json.loads(choice["message"]["content"] or "")
    except ValueError:
        return "unparsable", None
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
    except jsonschema.ValidationError:
        return "invalid", None
    except (jsonschema.SchemaError, Exception):  # noqa: BLE001 - a schema jsonschema cannot run
        return "invalid", None
    return "valid", None


async def ask(client: httpx.AsyncClient, model: str, schema: dict, max_tokens: int):
    body = {"model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": prompt(schema)}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "answer", "schema": schema}}}
    start = time.monotonic()
    try:
        r = await client.post("/v1/chat/completions", json=body)
        payload = r.json()
        status = r.status_code
    except (httpx.HTTPError, ValueError) as exc:
        return 599, {"error": {"message": str(exc)}}, time.monotonic() - start
    return status, payload, time.monotonic() - start


async def run(url: str, model: str, items, max_tokens: int, concurrency: int):
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
        async def one(item):
            async with gate:
                _, _, schema = item
                status, body, seconds = await ask(client, model, schema, max_tokens)
                return (*verdict(schema, status, body), seconds)

        return await asyncio.gather(*(one(item) for item in items))


def report(items, results, wall: float) -> None:
    kinds = ("valid", "truncated", "refused", "unparsable", "invalid", "5xx")
    by_set: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    features: collections.Counter = collections.Counter()
    for (name, _, _), (outcome, feature, _) in zip(items, results):
        by_set[name][outcome] += 1
        if feature:
            features[feature] += 1
    print(f"{'set':<16}" + "".join(f"{k:>11}" for k in kinds) + "   coverage")
    total: collections.Counter = collections.Counter()
    for name, counts in sorted(by_set.items()):
        total.update(counts)
        n = sum(counts.values())
        print(f"{name:<16}" + "".join(f"{counts[k]:>11}" for k in kinds)
              + f"   {counts['valid'] / n:.2f}")
    n = sum(total.values())
    print(f"{'all':<16}" + "".join(f"{total[k]:>11}" for k in kinds)
          + f"   {total['valid'] / n:.2f}")
    if features:
        print("refused, by feature: " + ", ".join(f"{f} {c}" for f, c in features.most_common()))
    latencies = sorted(r[2] for r in results)
    print(f"{n} schemas in {wall:.0f} s; request latency p50 {statistics.median(latencies):.2f} s,"
          f" p99 {latencies[int(0.99 * (n - 1))]:.2f} s")


def compile_times(items) -> None:
    """Cold compile time of each sampled schema with the server's own backend."""
    from radixserve.structured.llguidance_backend import LLGuidanceBackend
    from radixserve.structured.params import StructuredOutputsParams
    from radixserve.tokenizer.tokenizer import load_tokenizer
    from radixserve.models.source import ModelSource

    tokenizer = load_tokenizer(ModelSource.resolve(None))
    backend = LLGuidanceBackend.from_tokenizer(tokenizer, tokenizer.vocab_size)
    backend.compile(StructuredOutputsParams(regex="a").spec())  # the tokenizer view, once
    times, failed = [], 0
    for _, _, schema in items:
        spec = StructuredOutputsParams(json=schema, strict=True).spec()
        start = time.perf_counter()
        try:
            backend.compile(spec)
        except ValueError:
            failed += 1
            continue
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"grammar compile (cold, {len(times)} schemas, {failed} refused): "
          f"p50 {1000 * statistics.median(times):.1f} ms, "
          f"p99 {1000 * times[int(0.99 * (len(times) - 1))]:.1f} ms, max {1000 * times[-1]:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="the jsonschemabench repository's data/ folder")
    parser.add_argument("--per-set", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", nargs="*", default=None, help="only these sets")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--compile", action="store_true", help="also time grammar compiles")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra `radixserve serve` argument (repeatable)")
    args = parser.parse_args()
    items = sample(args.data, args.per_set, args.seed, args.sets)
    print(f"CPU: {cpu_name()}; load average {os.getloadavg()[0]:.2f}")
    if args.compile:
        compile_times(items)
    if args.url:
        url, proc = args.url, None
    else:
        from server_proc import ServerProc

        proc = ServerProc(*args.server_arg, timeout=600)
        url = proc.url
        args.model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    try:
        start = time.monotonic()
        results = asyncio.run(run(url, args.model, items, args.max_tokens, args.concurrency))
        report(items, results, time.monotonic() - start)
    finally:
        if proc is not None:
            proc.stop()


if __name__ == "__main__":
    main()
