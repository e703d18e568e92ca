"""A KV events publisher that cannot keep up, for the tests that force drops: its thread is
stuck (a stand-in for one starved of CPU or busy serving replays) until ``release`` is set,
so batches beyond its queue are refused and counted while the engine steps on."""

from __future__ import annotations

import threading

from radixserve.engine.kv_events import ZmqPublisher


class StalledPublisher(ZmqPublisher):
    def __init__(self, *args, **kwargs) -> None:
        self.release = threading.Event()  # set before the thread starts in __init__
        super().__init__(*args, **kwargs)

    def _run(self) -> None:
        self.release.wait()
        super()._run()


def stall_publisher(engine) -> StalledPublisher:
    """Swap ``engine``'s publisher for a stalled one with the same config (a fresh bind)."""
    old = engine.kv_events.publisher
    old.close()
    new = StalledPublisher(old.config, old.medium)
    engine.kv_events.publisher = new
    return new
