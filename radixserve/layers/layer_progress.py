"""A long forward's sign of life between its layers.

The layer stacks (models/native_stack.py) call ``layer_done()`` after each decoder layer. The
engine process installs a beat there (engine/core_proc.py: `Heartbeat`) that sends the API
process an empty output message when a few seconds have passed since its last message. The API
process takes a message as progress (frontend/progress_watch.py), so one long step — a 2,048-
token prefill of a 3B model on two AVX2 cores takes more than the 30 s stall limit — is not
killed as a hang, while a step stuck inside one layer still is. Elsewhere (the Python API, tests)
nothing is installed and the call does nothing.
"""

from __future__ import annotations

from collections.abc import Callable


def _nothing() -> None:
    return None


_beat: Callable[[], None] = _nothing


def install(beat: Callable[[], None] | None) -> None:
    """Call ``beat`` after every decoder layer from now on (None: nothing)."""
    global _beat
    _beat = beat or _nothing


def layer_done() -> None:
    _beat()
