"""``radixserve serve``'s start-up (issue 63), read from its own start-up profile
(``RADIXSERVE_STARTUP_PROFILE``, radixserve/startup_trace.py) on the embedded model: each
process parses the GGUF's metadata once and builds the tokenizer once, and the engine process
is the one started before the flags were parsed (cluster/engine_prestart.py)."""

from __future__ import annotations

import json
import pstats
import time
from pathlib import Path

from server_proc import ServerProc

from radixserve.tokenizer.tokenizer import Tokenizer


def _records(folder: Path, timeout: float = 60.0) -> dict[str, dict]:
    """Each process's record, once the engine's background structured warm has ended too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = {r["role"]: r for r in (json.loads(p.read_text())
                                          for p in folder.glob("*.json"))}
        engine = records.get("engine", {"spans": []})
        if "api" in records and any(s[0] == "structured warm" for s in engine["spans"]):
            return records
        time.sleep(0.2)
    raise AssertionError(f"no complete records in {folder}: {list(folder.iterdir())}")


def _calls(folder: Path, role: str, path_end: str, line: int | None, name: str) -> int:
    """How often ``name`` (defined in a file ending ``path_end``, at ``line`` if given) was
    called in ``role``'s profiles: its main thread's and its profiled spans'."""
    total = 0
    for prof in folder.glob(f"{role}-*.prof"):
        for (path, at, func), (_, ncalls, *_rest) in pstats.Stats(str(prof)).stats.items():
            if path.endswith(path_end) and func == name and line in (None, at):
                total += ncalls
    return total


def test_each_process_parses_the_metadata_and_builds_the_tokenizer_once(tmp_path):
    folder = tmp_path / "startup"
    server = ServerProc(env={"RADIXSERVE_STARTUP_PROFILE": str(folder)})
    try:
        records = _records(folder)
    finally:
        assert server.stop() == 0
    tokenizer_init = Tokenizer.__init__.__code__.co_firstlineno
    for role in ("api", "engine"):
        assert _calls(folder, role, "radixserve/gguf_reader.py", None, "open_gguf") == 1, role
        assert _calls(folder, role, "radixserve/tokenizer/tokenizer.py", tokenizer_init,
                      "__init__") == 1, role
    marks = [name for name, _ in records["engine"]["marks"]]
    assert marks.index("torch imported ahead") < marks.index("engine built")
