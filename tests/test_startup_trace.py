"""radixserve/startup_trace.py: what a process records of its start-up, on request (issue 63).
Each case runs in a child interpreter: the recorder is per process."""

from __future__ import annotations

import json
import os
import pstats
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = """
import threading, time
from radixserve import startup_trace as t
t.begin("api")
t.mark("step one")
def work():
    with t.span("in a thread", profile=True):
        sum(range(10000))
worker = threading.Thread(target=work, name="worker")
worker.start(); worker.join()
t.end()
with t.span("after the end"):
    time.sleep(0.01)
t.end()  # a second end changes nothing
"""


def _run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          check=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": _REPO, **env})


def test_without_the_variable_nothing_is_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXSERVE_STARTUP")}
    subprocess.run([sys.executable, "-c", _CHILD], check=True, cwd=tmp_path,
                   env={**env, "PYTHONPATH": _REPO})
    assert list(tmp_path.iterdir()) == []


def test_marks_spans_and_profiles_on_one_clock(tmp_path):
    folder = tmp_path / "trace"
    before = time.time()
    _run(tmp_path, RADIXSERVE_STARTUP_PROFILE=str(folder))
    after = time.time()
    [record_path] = folder.glob("api-*.json")
    record = json.loads(record_path.read_text())
    pid = record["pid"]
    assert record["role"] == "api"
    assert before - 1 <= record["created"] <= before + 1  # /proc's clock tick, near launch
    names = [name for name, _ in record["marks"]]
    assert names == ["begin", "step one", "end"]
    times = [t for _, t in record["marks"]]
    assert times == sorted(times) and before <= times[0] and times[-1] <= after
    spans = {name: (thread, start, end) for name, thread, start, end in record["spans"]}
    assert spans["in a thread"][0] == "worker"
    assert spans["after the end"][2] >= times[-1]  # recorded after the main thread's end
    assert {p.name for p in folder.glob("*.prof")} == {f"api-{pid}.prof",
                                                       f"api-in a thread-{pid}.prof"}
    stats = pstats.Stats(str(folder / f"api-in a thread-{pid}.prof")).stats
    assert any("builtins.sum" in func for _, _, func in stats)  # the work in the span


def test_marks_only_writes_no_profile(tmp_path):
    folder = tmp_path / "trace"
    _run(tmp_path, RADIXSERVE_STARTUP_PROFILE=str(folder),
         RADIXSERVE_STARTUP_PROFILE_MARKS_ONLY="1")
    assert [p.suffix for p in folder.iterdir()] == [".json"]
    record = json.loads(next(folder.glob("*.json")).read_text())
    assert [name for name, *_ in record["spans"]] == ["in a thread", "after the end"]
