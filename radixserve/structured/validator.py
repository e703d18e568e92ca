"""The API process's check of a structured-output spec, before the request is queued.

An invalid schema, regex or grammar must be a 400 naming the problem, not an error from deep
in the engine. The check runs on a worker thread (llguidance releases the GIL) under a limit
in CPU seconds (structured/cpu_budget.py: a busy machine does not make a spec invalid), so a
pathological spec neither blocks the event loop nor hangs the request; verdicts
are remembered per spec, so a repeated schema is checked once. The server's check compiles
the spec against the tokenizer and walks its first tokens (`grammar_validator`), so a grammar
beyond the matcher's limits is refused here, not at some output token.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from radixserve.cpu.threads import background_priority
from radixserve.structured.backend import GrammarError
from radixserve.structured.cpu_budget import CpuTimedJob
from radixserve.structured.params import GrammarSpec, StructuredOutputsParams

_CACHE_SIZE = 1024


class _Overrun(GrammarError):
    """A check that overran its time limit: a 400, but not a verdict on the spec."""


def _llguidance_validate(spec: GrammarSpec) -> None:
    from radixserve.structured.llguidance_spec import validate_spec

    validate_spec(spec)


def grammar_validator(tokenizer, timeout_s: float = 10.0) -> GrammarValidator:
    """The server's validator: each new spec compiled and probed against ``tokenizer`` (as
    the engine will compile it; `SpecChecker`), whose llguidance view is built by
    `GrammarValidator.warm_when_quiet` or the first check."""
    from radixserve.structured.llguidance_probe import SpecChecker

    return GrammarValidator(SpecChecker(tokenizer), timeout_s)


class GrammarValidator:
    def __init__(self, validate: Callable[[GrammarSpec], None] = _llguidance_validate,
                 timeout_s: float = 10.0) -> None:
        self._validate = validate
        self.timeout_s = timeout_s
        self._verdicts: OrderedDict[GrammarSpec, str] = OrderedDict()  # "" = valid
        # NOTE: its own threads: a check that overran its time limit runs on (llguidance
        # cannot be interrupted) and must not hold a thread of the loop's default pool.
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="radixserve-grammar-check",
                                        initializer=background_priority)

    async def warm_when_quiet(self, num_in_flight: Callable[[], int],
                              quiet_s: float = 1.0) -> None:
        """Build the checker's tokenizer view (llguidance's: ~0.4 CPU s holding the GIL for a
        152k vocabulary) on the validator's thread once no request has been in flight for
        ``quiet_s``: not beside the engine's load, which it slowed (coder 1.5B: ready 2.97 s
        against 2.42 s without it), nor beside the first requests. A constrained request
        before then builds it itself."""
        warm = getattr(self._validate, "warm", None)
        if warm is None:
            return
        quiet = 0.0
        while quiet < quiet_s:
            await asyncio.sleep(0.25)
            quiet = 0.0 if num_in_flight() else quiet + 0.25
        await asyncio.get_running_loop().run_in_executor(self._pool, warm)

    async def check(self, params: StructuredOutputsParams) -> None:
        """GrammarError (a ValueError) if the spec is invalid or its check overruns."""
        try:
            spec = params.spec()
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        verdict = self._verdicts.get(spec)
        if verdict is None:
            job = CpuTimedJob(self._validate, spec)
            work = asyncio.get_running_loop().run_in_executor(self._pool, job)
            try:
                verdict = await self._within_budget(work, job, f"checking the {spec.kind}")
            except _Overrun:
                raise
            except GrammarError as exc:
                verdict = str(exc)
            self._verdicts[spec] = verdict
            if len(self._verdicts) > _CACHE_SIZE:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(spec)
        if verdict:
            raise GrammarError(verdict)

    async def _within_budget(self, work: asyncio.Future, job: CpuTimedJob, what: str) -> str:
        """"" once ``work`` is done (its GrammarError propagates); GrammarError (not cached:
        the spec may be fine on a quieter machine) when it overruns its CPU budget or the
        wall-clock backstop (structured/cpu_budget.py). An overrun check runs on: llguidance
        cannot be interrupted."""
        while True:
            done, _ = await asyncio.wait({work}, timeout=min(0.25, self.timeout_s))
            if done:
                work.result()
                return ""
            if (why := job.overrun(self.timeout_s, what)) is not None:
                raise _Overrun(why)
