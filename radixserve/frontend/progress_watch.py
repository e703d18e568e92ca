"""ProgressWatch: when the engine last showed progress, and how long its steps take.

The engine sends one ``EngineCoreOutputs`` per step while it has work, and an empty one between
the decoder layers of a step longer than a few seconds (engine/core_proc.py ``Heartbeat``), so
in the API process "a message arrived" is the engine's heartbeat, and the gap between two
messages while requests are in flight is one step's time, or a long step's few seconds (plus
the engine's input handling, which is small):

    work arrives at an idle engine ──▶ clock starts (t0)
    message ──▶ step time = now - t0, recorded;  t0 = now
    message ──▶ step time = now - t0, recorded;  t0 = now
    ... silence: silent_for(now) = now - t0

An engine is stalled when, with requests in flight, it stays silent longer than
``limit(timeout_s) = max(timeout_s, factor × the longest step of the last window_s seconds)``:
the flag's value is a floor, and a model whose steps are slow (long prefill chunks, a busy
machine) gets a limit that grows with them, so a slow step is not taken for a hang. Nothing is
measured while the engine is idle (it sends nothing then); an engine that stops while idle is
noticed once work arrives, ``limit`` later.
"""

from __future__ import annotations

from collections import deque

STEP_FACTOR = 4.0  # a step this many times the longest recent one is a hang
STEP_WINDOW_S = 600.0  # how long a measured step counts


class ProgressWatch:
    """Fed by the engine-core client (``work_arrived``, ``output_arrived``, ``reset``);
    read by the supervisor. Times are ``time.monotonic()`` seconds; mutates only itself."""

    def __init__(self, now: float, factor: float = STEP_FACTOR,
                 window_s: float = STEP_WINDOW_S) -> None:
        self.factor = factor
        self.window_s = window_s
        self._since = now  # the last message, or work arriving at an idle engine
        # (time, step seconds), the steps decreasing: the window's maximum is the first
        self._longest: deque[tuple[float, float]] = deque()

    def reset(self, now: float) -> None:
        """A new engine: no steps measured yet."""
        self._since = now
        self._longest.clear()

    def work_arrived(self, now: float, was_idle: bool) -> None:
        """A request was sent; ``was_idle``: none was in flight, so the clock starts now."""
        if was_idle:
            self._since = now

    def output_arrived(self, now: float, was_busy: bool) -> None:
        """A message from the engine; ``was_busy``: requests were in flight before it, so
        the time since the previous one was a step."""
        if was_busy:
            step = now - self._since
            while self._longest and self._longest[-1][1] <= step:
                self._longest.pop()
            self._longest.append((now, step))
        self._since = now

    def longest_step(self, now: float) -> float:
        """The longest step measured in the last ``window_s`` seconds (0: none)."""
        while self._longest and now - self._longest[0][0] > self.window_s:
            self._longest.popleft()
        return self._longest[0][1] if self._longest else 0.0

    def limit(self, timeout_s: float, now: float) -> float:
        """Seconds of silence with work in flight that mean a hang."""
        return max(timeout_s, self.factor * self.longest_step(now))

    def silent_for(self, now: float) -> float:
        """Seconds since the last message (or since work arrived at an idle engine)."""
        return now - self._since
