"""Grammar time limits in CPU seconds (structured/cpu_budget.py): a check or compile slowed by
a busy machine (asleep here: no CPU used) passes, one that burns its CPU budget is refused
with a message naming the cause, and a wait past the wall-clock backstop says the server is
overloaded. An overrun is not remembered as the spec's verdict."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixserve.structured.backend import GrammarError
from radixserve.structured.cpu_budget import CpuTimedJob
from radixserve.structured.params import StructuredOutputsParams as SO
from radixserve.structured.validator import GrammarValidator


def spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time (however busy the machine is)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def check(validate, timeout_s: float, params: SO) -> None:
    asyncio.run(GrammarValidator(validate, timeout_s).check(params))


def test_slow_on_the_clock_but_idle_passes():
    check(lambda spec: time.sleep(0.4), 0.1, SO(regex="a"))


def test_cpu_overrun_is_refused_naming_the_cause():
    with pytest.raises(GrammarError, match="used over 0.1 s of CPU time"):
        check(lambda spec: spin(0.6), 0.1, SO(regex="a"))


def test_wall_backstop_says_overloaded_and_is_not_cached():
    calls = []

    def slow_once(spec):
        calls.append(spec)
        if len(calls) == 1:
            time.sleep(0.5)  # 0.02 s budget: the backstop is 0.24 s

    validator = GrammarValidator(slow_once, 0.02)

    async def twice():
        with pytest.raises(GrammarError, match="overloaded"):
            await validator.check(SO(regex="a"))
        await asyncio.sleep(0.4)  # the first check finishes on its thread
        await validator.check(SO(regex="a"))  # checked again, now fine

    asyncio.run(twice())
    assert len(calls) == 2


def test_job_counts_its_own_cpu_only():
    job = CpuTimedJob(spin, 0.2)
    assert job.cpu_seconds() == 0.0  # not started
    job()
    assert 0.15 <= job.cpu_seconds() <= 1.0
