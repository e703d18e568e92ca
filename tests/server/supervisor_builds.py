"""Engine builds for `EngineSupervisor` tests, importable by a spawned engine process."""

from __future__ import annotations

import os


def mock_unless_marker(marker: str):
    """The mock engine, or a load failure once the file ``marker`` exists."""
    if os.path.exists(marker):
        raise RuntimeError("the model file is gone")
    from radixserve.bench.mock_engine import MockEngine

    return MockEngine(1000, 4096)
