"""The engine-core process freezes its start-up heap (core_proc.py ``_freeze_start_up_heap``):
once the engine is built, everything loading allocated is out of the garbage collector's walks,
so a full collection no longer stalls a step for the time it takes to visit the libraries' and
the model's objects. Run in a subprocess: freezing is for the life of a process."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import gc, json, tempfile, threading
import msgspec, zmq
from radixserve.bench.mock_engine import MockEngine
from radixserve.engine.core_proc import run_engine_core
from radixserve.messages import EngineReady, Shutdown

folder = tempfile.mkdtemp()
inp, outp = f"ipc://{folder}/in", f"ipc://{folder}/out"
ctx = zmq.Context()
push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
push.bind(inp)
pull.bind(outp)
tracked_before = len(gc.get_objects())
frozen_before = gc.get_freeze_count()
ready = []


def client():  # the engine loop runs on the main thread (it sets a signal handler)
    ready.append(msgspec.msgpack.Decoder(EngineReady).decode(pull.recv()))
    push.send(msgspec.msgpack.Encoder().encode(Shutdown()))


threading.Thread(target=client, daemon=True).start()
run_engine_core(lambda: MockEngine(1000, 256), inp, outp)
print(json.dumps({"error": ready[0].error, "tracked_before": tracked_before,
                  "frozen_before": frozen_before, "frozen": gc.get_freeze_count(),
                  "tracked": len(gc.get_objects())}))
"""


def test_the_engine_process_freezes_what_start_up_allocated():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=60, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["error"] is None, found
    assert found["frozen_before"] == 0, found
    # the imports and the engine: thousands of objects, all frozen; few tracked after
    assert found["frozen"] > found["tracked_before"] / 2 > 5_000, found
    assert found["tracked"] < found["frozen"] / 10, found
