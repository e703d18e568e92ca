"""Structured output cost on the embedded model (issue 5): prints figures, asserts nothing.

1. compile: time to validate and to compile (against the tokenizer) each of a set of schemas,
   a regex and a grammar, each never seen before.
2. TTFT of a request with a never-seen schema vs an unconstrained one (offline, one stream).
3. throughput at 32 concurrent requests, 128 output tokens each: unconstrained vs every
   request JSON-schema constrained (a schema that cannot finish within 128 tokens, so all
   rows produce exactly 128), with fast-forward off (pure mask cost) and on; plus the mask
   fill time per token per request and the apply time per step, measured in the run.

Usage: .venv/bin/python benchmarks/bench_structured.py [--concurrency 32] [--output-len 128]
       [--reps 2] [--only compile,ttft,throughput] [--distinct]
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixserve import LLM, SamplingParams, StructuredOutputsParams
from radixserve.runner import sampler as sampler_mod
from radixserve.structured.llguidance_backend import LLGuidanceBackend
from radixserve.structured.llguidance_spec import validate_spec

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "email", "tags"], "additionalProperties": False}
LONG = {"type": "array", "items": PERSON, "minItems": 100}
SCHEMAS = {
    "flat object": {"type": "object", "properties": {"a": {"type": "integer"}},
                    "required": ["a"]},
    "person": PERSON,
    "array of 100 persons": LONG,
    "nested $defs": {"$defs": {"addr": {"type": "object", "properties": {
        "street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["street", "zip"]}}, "type": "object", "properties": {
        "home": {"$ref": "#/$defs/addr"}, "work": {"$ref": "#/$defs/addr"}},
        "required": ["home"]},
    "anyOf 8 tools": {"type": "array", "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": f"tool_{i}"}, "arguments": PERSON},
         "required": ["name", "arguments"]} for i in range(8)]}, "minItems": 1},
}


def bench_compile(llm: LLM) -> None:
    backend = LLGuidanceBackend.from_tokenizer(llm.get_tokenizer(), llm.engine.vocab_size)
    t0 = time.perf_counter()
    backend.compile(StructuredOutputsParams(regex="warm").spec())  # builds the tokenizer view
    print(f"tokenizer view for llguidance (once per process): "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
    specs = {name: StructuredOutputsParams(json=s) for name, s in SCHEMAS.items()}
    specs["regex email"] = StructuredOutputsParams(regex=r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)")
    specs["lark arithmetic"] = StructuredOutputsParams(grammar=(
        'start: expr\nexpr: term (("+"|"-") term)*\nterm: factor (("*"|"/") factor)*\n'
        'factor: NUMBER | "(" expr ")"\nNUMBER: /[0-9]{1,3}/'))
    print(f"{'spec':24} {'validate ms':>12} {'compile ms':>11} {'first mask us':>14}")
    for name, so in specs.items():
        spec = so.spec()
        t0 = time.perf_counter()
        validate_spec(spec)
        t1 = time.perf_counter()
        grammar = backend.compile(spec)
        t2 = time.perf_counter()
        bitmask = backend.allocate_bitmask(1)
        backend.fill_bitmask([grammar.new_matcher()], bitmask)
        t3 = time.perf_counter()
        print(f"{name:24} {(t1 - t0) * 1e3:12.2f} {(t2 - t1) * 1e3:11.2f} "
              f"{(t3 - t2) * 1e6:14.0f}")


def bench_ttft(llm: LLM) -> None:
    messages = [{"role": "user", "content": "Give me a person as JSON."}]

    def ttft(params) -> float:
        t0 = time.perf_counter()
        stream = llm.stream(messages, params, chat=True)
        next(stream)
        dt = time.perf_counter() - t0
        stream.close()
        return dt

    free = [ttft(SamplingParams(temperature=0, max_tokens=4)) for _ in range(3)]
    fresh = []
    for i in range(3):
        schema = dict(PERSON, properties={**PERSON["properties"], f"id_{i}_{time.time_ns()}":
                                          {"type": "integer"}})
        so = StructuredOutputsParams(json=schema)
        fresh.append(ttft(SamplingParams(temperature=0, max_tokens=4, structured_outputs=so)))
    print(f"TTFT unconstrained: {statistics.median(free) * 1e3:.0f} ms; never-seen schema: "
          f"{statistics.median(fresh) * 1e3:.0f} ms (median of 3)")


class _Timer:
    """Wraps the backend's fill and the sampler's apply to time them inside a real run."""

    def __init__(self, llm: LLM) -> None:
        self.backend = llm.engine.structured.backend
        self.fill_s = self.apply_s = 0.0
        self.rows = self.steps = 0
        self._fill, self._apply = self.backend.fill_bitmask, sampler_mod.apply_bitmask

        def timed_fill(matchers, bitmask):
            t0 = time.perf_counter()
            self._fill(matchers, bitmask)
            self.fill_s += time.perf_counter() - t0
            self.rows += len(matchers)

        def timed_apply(logits, rows, bitmask):
            t0 = time.perf_counter()
            self._apply(logits, rows, bitmask)
            self.apply_s += time.perf_counter() - t0
            self.steps += 1

        self.backend.fill_bitmask = timed_fill
        sampler_mod.apply_bitmask = timed_apply

    def close(self) -> None:
        self.backend.fill_bitmask = self._fill
        sampler_mod.apply_bitmask = self._apply


def _distinct(i: int) -> dict:
    """The i-th of ``concurrency`` different schemas of LONG's shape (its own grammar)."""
    person = {**PERSON, "properties": {**PERSON["properties"],
                                       "name": {"type": "string", "maxLength": 24 + i}}}
    return {**LONG, "items": person}


def bench_throughput(model, concurrency: int, output_len: int, reps: int,
                     distinct: bool = False) -> None:
    """Unconstrained and constrained runs alternate in one process (this machine's speed
    drifts between sittings); each line is one run. ``distinct``: every request its own
    schema (and grammar), else all share one."""
    messages = [[{"role": "user", "content": f"List {100 + i} people as JSON."}]
                for i in range(concurrency)]
    so = ([StructuredOutputsParams(json=_distinct(i)) for i in range(concurrency)] if distinct
          else StructuredOutputsParams(json=LONG))
    runs = [("unconstrained", None, True), ("JSON schema, fast-forward off", so, False),
            ("JSON schema, fast-forward on", so, True)]
    llms = {ff: LLM(model, max_num_seqs=concurrency, structured_fast_forward=ff,
                    show_progress=False) for ff in (False, True)}
    for llm in llms.values():
        first = so[0] if distinct else so
        llm.chat(messages[:2], SamplingParams(temperature=0, max_tokens=4,
                                              structured_outputs=first))
    for _ in range(reps):
        base = None
        for label, constraint, ff in runs:
            timer = _Timer(llms[ff])
            params = [SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True,
                                     structured_outputs=c) for c in (
                constraint if isinstance(constraint, list) else [constraint] * concurrency)]
            t0 = time.perf_counter()
            outs = llms[ff].chat(messages, params)
            dt = time.perf_counter() - t0
            timer.close()
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rate = tokens / dt
            base = base or rate
            line = (f"{label:32} {tokens:6d} tokens {dt:6.1f} s {rate:7.1f} tok/s "
                    f"({(rate / base - 1) * 100:+.1f}% vs unconstrained)")
            if timer.rows:
                line += (f"; mask fill {timer.fill_s / timer.rows * 1e6:.0f} us/token/request, "
                         f"apply {timer.apply_s / timer.steps * 1e3:.2f} ms/step")
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--only", default="compile,ttft,throughput")
    parser.add_argument("--reps", type=int, default=2, help="alternating throughput rounds")
    parser.add_argument("--distinct", action="store_true",
                        help="throughput: every request its own schema")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if only & {"compile", "ttft"}:
        llm = LLM(args.model, show_progress=False)
        if "compile" in only:
            bench_compile(llm)
        if "ttft" in only:
            bench_ttft(llm)
        del llm
    if "throughput" in only:
        bench_throughput(args.model, args.concurrency, args.output_len, args.reps,
                         args.distinct)


if __name__ == "__main__":
    main()
