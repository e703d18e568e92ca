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
    the engine will compile it; `SpecChecker`), whose llguidance view is built now."""
    from radixserve.structured.llguidance_probe import SpecChecker

    checker = SpecChecker(tokenizer)
    checker.warm()
    return GrammarValidator(checker, timeout_s)


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
