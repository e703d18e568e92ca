"""Test-only fault injection: a runner wrapper that raises on chosen engine steps.

Nothing here is active in a normal run: ``build_engine_core`` wraps its runner only when
the environment variable ``RADIXSERVE_FAULT_INJECT`` is set (it is read once, when the engine
is built, and a WARNING says so); tests may also wrap a runner themselves (``FaultyRunner``).

The value lists ``KIND@STEP`` items, comma-separated, e.g. ``forward@3,sample@7``. STEP counts
the runner's ``execute`` calls in this engine process from 1 (steps that run a batch; a
restarted engine counts afresh). KIND is where the step raises `InjectedFault`:

- ``forward``: from the model's forward, after the step's KV has been written (a kernel error);
- ``sample``: from the sampler, after the forward (a sampling bug).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

ENV_VAR = "RADIXSERVE_FAULT_INJECT"
KINDS = ("forward", "sample")

logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised by a step chosen for fault injection."""


@dataclass(frozen=True)
class FaultPlan:
    """Which runner steps (1-based) raise, and where."""

    faults: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """``"forward@3,sample@7"`` → a plan; ValueError naming the supported form."""
        faults = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            kind, _, step = item.partition("@")
            if kind not in KINDS or not step.isdigit() or int(step) < 1:
                raise ValueError(f"{ENV_VAR}: bad item {item!r}; expected KIND@STEP with KIND "
                                 f"one of {', '.join(KINDS)} and STEP a step number >= 1")
            faults.append((kind, int(step)))
        if not faults:
            raise ValueError(f"{ENV_VAR} is set but names no fault (e.g. 'forward@3')")
        return cls(tuple(faults))

    def kind_at(self, step: int) -> str | None:
        return next((kind for kind, at in self.faults if at == step), None)


class FaultyRunner:
    """``runner`` (a `ModelRunner`: it has ``model`` and ``sampler``) whose steps in ``plan``
    raise `InjectedFault`; everything else is the wrapped runner's."""

    def __init__(self, runner, plan: FaultPlan) -> None:
        self._runner = runner
        self.plan = plan
        self.num_steps = 0

    def __getattr__(self, name: str):
        return getattr(self._runner, name)

    def execute(self, sched, grammar=None):
        self.num_steps += 1
        kind = self.plan.kind_at(self.num_steps)
        if kind is None:
            return self._runner.execute(sched, grammar)
        message = f"injected {kind} fault at engine step {self.num_steps}"
        with _raising(self._runner, kind, message):
            return self._runner.execute(sched, grammar)


def inject_faults_from_env(runner):
    """``runner`` itself, or wrapped in a `FaultyRunner` when ``RADIXSERVE_FAULT_INJECT`` is
    set (tests only)."""
    text = os.environ.get(ENV_VAR)
    if not text:
        return runner
    plan = FaultPlan.parse(text)
    logger.warning("fault injection active (%s=%s): for tests only", ENV_VAR, text)
    return FaultyRunner(runner, plan)


@contextlib.contextmanager
def _raising(runner, kind: str, message: str):
    """For one step: make the model's forward (after it ran) or the sampler raise."""
    def fail(*_args, **_kwargs):
        raise InjectedFault(message)

    if kind == "forward":
        handle = runner.model.register_forward_hook(fail)
        try:
            yield
        finally:
            handle.remove()
        return
    sampler = runner.sampler
    runner.sampler = fail
    try:
        yield
    finally:
        runner.sampler = sampler
