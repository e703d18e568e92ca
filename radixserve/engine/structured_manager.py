"""StructuredOutputManager: the engine core's side of structured output.

Compiles grammars on a background thread (cached by spec, so a repeated schema costs nothing
and a slow compile never stalls the step loop), gives each constrained request its
`RequestGrammar`, and computes each step's batch bitmask on another thread while the forward
runs (the next token's mask depends only on tokens already accepted).

It lives in engine/, not structured/: it reads core's `Request` and `SchedulerOutput`, and
structured/ stays a library below core (sampling_params.py holds its
`StructuredOutputsParams`, and core holds sampling params: tests/test_layout.py).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from radixserve import startup_trace
from radixserve.core.grammar_hooks import NO_GRAMMAR, Grammar
from radixserve.core.request import Request
from radixserve.core.sched_output import GrammarBitmask, SchedulerOutput
from radixserve.cpu.threads import background_priority
from radixserve.structured.backend import CompiledGrammar, GrammarError, StructuredBackend
from radixserve.structured.cpu_budget import CpuTimedJob
from radixserve.structured.params import GrammarSpec, StructuredOutputsParams
from radixserve.structured.request_grammar import RequestGrammar
from radixserve.structured.wind_down import EVERY, LOOKAHEAD, WindDown

_CACHE_SIZE = 256
logger = logging.getLogger(__name__)


class StructuredOutputManager:
    def __init__(self, backend: StructuredBackend, fast_forward: bool = True,
                 compile_timeout_s: float = 10.0) -> None:
        """``compile_timeout_s``: the CPU seconds a compile may use (structured/cpu_budget.py:
        a busy machine slows a compile on the clock, not in CPU time)."""
        self.backend = backend
        self.fast_forward = fast_forward
        self.compile_timeout_s = compile_timeout_s
        # spec -> (its compile, the job whose CPU time bounds it: structured/cpu_budget.py)
        self._compiles: OrderedDict[GrammarSpec, tuple[Future[CompiledGrammar], CpuTimedJob]] = (
            OrderedDict())
        self._compile_pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-grammar",
                                                initializer=background_priority)
        self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-mask")
        self.wind_down = WindDown(backend.token_bytes, backend.vocab_size,
                                  lambda m, row: backend.fill_bitmask([m], row))
        self._closing: dict[str, tuple[int, int]] = {}  # request -> (at tokens left, cost)

    def warm(self) -> Future[None]:
        """Build, on the compile thread, what the first constrained request would otherwise
        build (the backend's view of the tokenizer, the wind-down's token classes: about half
        a second holding the GIL, which stalled every running stream when it happened at the
        first structured request: benchmarks/structured_pathological.py). Call at start-up."""
        return self._compile_pool.submit(self._warm)

    def _warm(self) -> None:
        with startup_trace.span("structured warm", profile=True):
            self.wind_down.warm()

    def validate(self, params: StructuredOutputsParams | None) -> None:
        """GrammarError (a ValueError) if the spec is invalid; cheap, no tokenizer needed."""
        if params is not None:
            self.backend.validate(params.spec())

    def grammar_for(self, params: StructuredOutputsParams | None) -> Grammar:
        """The request's grammar state; its compile starts now unless cached."""
        if params is None:
            return NO_GRAMMAR
        spec = params.spec()
        entry = self._compiles.get(spec)
        if entry is None:
            job = CpuTimedJob(self.backend.compile, spec)
            entry = self._compiles[spec] = (self._compile_pool.submit(job), job)
            while len(self._compiles) > _CACHE_SIZE:
                self._compiles.popitem(last=False)
        else:
            self._compiles.move_to_end(spec)
        future, job = entry
        return RequestGrammar(future, tuple(params.reasoning_end_token_ids), self.fast_forward,
                              functools.partial(job.overrun, self.compile_timeout_s,
                                                "compiling the structured output grammar"),
                              functools.partial(self._refuse, spec))

    def _refuse(self, spec: GrammarSpec, why: str) -> None:
        """A request's matcher of ``spec`` hit one of its limits mid-output: later requests
        with the spec are refused before their first token (the compile is spent, too: the
        matchers of one compile share llguidance's lexer, so the next request's matcher fails
        at once). Engine thread only, as `grammar_for`."""
        entry = self._compiles.get(spec)
        if entry is not None:
            refused: Future[CompiledGrammar] = Future()
            refused.set_exception(GrammarError(why))
            self._compiles[spec] = (refused, entry[1])

    def wait_for_compiles(self, grammars: Iterable[Grammar],
                          timeout: float) -> None:
        """Block until one of the pending compiles finishes, or ``timeout`` seconds."""
        pending = {g.pending_compile for g in grammars} - {None}
        if pending:
            wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)

    def bitmask(self, sched: SchedulerOutput,
                requests: Mapping[str, Request]) -> GrammarBitmask | None:
        """Start filling the bitmask of the step's constrained sampling rows (None: no row is
        constrained). The matchers must not advance until the runner has taken the result."""
        rows = [(seq, g) for seq in sched.seqs
                if seq.sample and (g := requests[seq.request_id].grammar).is_active]
        if not rows:
            return None
        plan = [(g, seq.draft_token_ids, self._budget(requests[seq.request_id]))
                for seq, g in rows]
        for gone in self._closing.keys() - requests.keys():
            del self._closing[gone]
        bitmask = self.backend.allocate_bitmask(sum(len(d) + 1 for _, d, _ in plan))
        future = self._mask_pool.submit(self._fill, plan, bitmask)
        return GrammarBitmask([seq.request_id for seq, _ in rows
                               for _ in range(seq.num_draft + 1)], future)

    def _budget(self, request: Request) -> tuple[str, int, int] | None:
        """(request id, tokens left, max_tokens) of a JSON-constrained request, for the
        wind-down rule (structured/wind_down.py); None for other constraints."""
        so = request.sampling_params.structured_outputs
        if so is None or (so.json is None and not so.json_object):
            return None
        return (request.request_id, request.max_tokens - request.num_output_tokens,
                request.max_tokens)

    def _fill(self, plan, bitmask):
        """One row per matcher; a drafting request's rows follow its draft (the matcher
        accepts each drafted token after its row, then rolls them all back). Rows in the
        last tokens of a JSON answer's budget are narrowed to close it (`WindDown`).
        NOTE: a grammar that fails here (a matcher out of its limits, a drafted token it
        refuses, any exception) fails its own request alone: its rows allow everything and
        `RequestGrammar.fail` makes its next token end it (finish reason "error"); raising
        would fail the whole step's batch."""
        row = 0
        for grammar, draft, budget in plan:
            rows = bitmask[row:row + len(draft) + 1]
            try:
                self._fill_rows(grammar.matcher, draft, budget, rows)
            except Exception as exc:  # noqa: BLE001 - one request's grammar, not the batch
                logger.exception("a grammar failed while its mask was computed")
                grammar.fail(f"the request's structured output grammar failed while its "
                             f"mask was computed: {type(exc).__name__}: {exc}")
                rows.fill_(-1)
            row += len(draft) + 1
        return bitmask

    def _fill_rows(self, matcher, draft: list[int], budget, rows) -> None:
        """The rows of one request: after 0, 1, .. len(draft) of its drafted tokens."""
        cost = self._closing_cost(matcher, budget)
        for i in range(len(draft) + 1):
            self.backend.fill_bitmask([matcher], rows[i:i + 1])
            if (error := matcher.error) is not None:  # it hit a limit computing the mask
                raise GrammarError(error)
            self._wind_down(rows[i], budget, cost, i)
            if i < len(draft) and not matcher.accept_token(draft[i]):
                raise RuntimeError(f"a checked draft token {draft[i]} broke the grammar")
        matcher.rollback(len(draft))

    def _closing_cost(self, matcher, budget: tuple[str, int, int] | None) -> int:
        """The request's closing cost within the last `LOOKAHEAD` tokens of its budget
        (structured/wind_down.py), 0 before. Measured again after half the distance between
        the tokens left and the cost (at least `EVERY` tokens), never once it exceeded the
        tokens left (narrowing then lasts to the end); a walk stops at the tokens left."""
        if budget is None:
            return 0
        rid, left, _ = budget
        if left > LOOKAHEAD:
            return 0
        measured = self._closing.get(rid)
        if measured is not None:
            at, cost = measured
            if cost >= at or at - left < max(EVERY, (at - cost) // 2):
                return cost  # past closing within the budget, or not due yet
        cost = self.wind_down.closing_cost(matcher, limit=left)
        self._closing[rid] = (left, cost)
        return cost

    def _wind_down(self, row, budget: tuple[str, int, int] | None, cost: int,
                   position: int) -> None:
        """``position``: the row's place after the request's last token (a draft's rows)."""
        if budget is not None and self.wind_down.applies(budget[1] - position, cost,
                                                         budget[2]):
            self.wind_down.narrow(row)

    def shutdown(self) -> None:
        self._compile_pool.shutdown(wait=False, cancel_futures=True)
        self._mask_pool.shutdown(wait=False, cancel_futures=True)
