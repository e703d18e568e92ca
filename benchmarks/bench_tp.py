"""Tensor parallel on one machine: the all-reduce, and decode step times (docs/scale-out.md).

    python benchmarks/bench_tp.py allreduce [--hidden 576]
        shm vs gloo all_reduce between 2 ranks pinned to CPUs 0 and 1 (1 thread each), at a
        step's sizes (1, 16, 256, 2048 rows of ``hidden`` float32): median microseconds a call
    python benchmarks/bench_tp.py steps [--model PATH] [--batches 1 16]
        decode step time (median over the steps where every request decodes) of TP=1 with 1
        thread, TP=1 with 2 threads and TP=2 with 1 thread per rank, each in a fresh process,
        and TP=2's all-reduce time per step (rank 0's, waiting for the other rank included).
        Default model: a random Llama (hidden 1024, 16 heads / 8 KV heads, MLP 2816, 8
        layers) as Q4_0 GGUF, built under /tmp by tests/tiny_models.py.

Figures on a shared machine are rough: report ``uptime``'s load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = (1, 16, 256, 2048)


# -- all-reduce -------------------------------------------------------------------------------

def _allreduce_rank(rank: int, port: int, shm_path: str, hidden: int, out) -> None:
    os.sched_setaffinity(0, [rank % os.cpu_count()])
    import torch
    import torch.distributed as dist

    from radixserve.parallel.shm_comm import ShmComm

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    comm = ShmComm(shm_path, rank, 2, max(ROWS) * hidden, 1 << 16, lambda: True)
    results = {}
    for rows in ROWS:
        x = torch.zeros(rows, hidden)  # in place, repeatedly: stays finite
        for name, fn in (("shm", comm.all_reduce), ("gloo", dist.all_reduce)):
            num = 2000 if rows <= 16 else 200
            for _ in range(num // 10):
                fn(x)
            times = []
            for _ in range(num):
                start = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - start)
            results[f"{name}/{rows}"] = statistics.median(times) * 1e6
    if rank == 0:
        out.put(results)
    dist.barrier()
    dist.destroy_process_group()


def bench_allreduce(hidden: int) -> None:
    import multiprocessing as mp
    import socket

    from radixserve.parallel.shm_comm import ShmComm

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = ShmComm.create("/dev/shm", 2, max(ROWS) * hidden, 1 << 16)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, path, hidden, out))
             for r in range(2)]
    for p in procs:
        p.start()
    results = out.get()
    for p in procs:
        p.join()
    os.unlink(path)
    print(f"all-reduce of [rows, {hidden}] float32, 2 ranks, median us per call")
    print("| rows | KiB | shm | gloo |")
    print("|---:|---:|---:|---:|")
    for rows in ROWS:
        print(f"| {rows} | {rows * hidden * 4 / 1024:.1f} | {results[f'shm/{rows}']:.1f} | "
              f"{results[f'gloo/{rows}']:.1f} |")


# -- decode steps -----------------------------------------------------------------------------

def _default_model() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import hf_to_gguf, make_hf_model

    folder = Path("/tmp/radixserve-bench-tp/llama-1024")
    gguf = folder.parent / "llama-1024-Q4_0" / "model.gguf"
    if not gguf.exists():
        make_hf_model("llama", folder, seed=0, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=64, max_position_embeddings=4096)
        hf_to_gguf(folder, gguf, "Q4_0")
    return str(gguf)


def _steps_child(model: str, tp: int, threads: int, batch: int) -> dict:
    from radixserve import LLM, SamplingParams
    from radixserve.messages import EngineCoreRequest

    llm = LLM(model, tensor_parallel_size=tp, threads=threads, num_kv_blocks=1024,
              show_progress=False)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    llm.generate([[5] * 32], SamplingParams(max_tokens=8, ignore_eos=True))  # warm up
    for i in range(batch):
        engine.add_request(EngineCoreRequest(
            request_id=f"r{i}", prompt_token_ids=[(7 * i + j) % 300 + 1 for j in range(32)],
            sampling_params=params))
    comm = getattr(getattr(engine.runner, "group", None), "comm", None)
    times, reduce_s = [], []
    while engine.has_unfinished_requests():
        decoding = all(r.num_computed_tokens >= len(r.prompt_token_ids)
                       for r in engine.scheduler.requests.values())
        before = comm.seconds if comm is not None else 0.0
        start = time.perf_counter()
        engine.step()
        if decoding and len(engine.scheduler.requests) == batch:
            times.append(time.perf_counter() - start)
            reduce_s.append((comm.seconds - before) if comm is not None else 0.0)
    llm.close()
    step = statistics.median(times)
    return {"tp": tp, "threads": threads, "batch": batch, "step_ms": step * 1e3,
            "allreduce_ms": statistics.median(reduce_s) * 1e3, "num_steps": len(times)}


def bench_steps(model: str | None, batches: list[int]) -> None:
    model = model or _default_model()
    rows = []
    for batch in batches:
        for tp, threads in ((1, 1), (1, 2), (2, 1)):
            out = subprocess.run([sys.executable, __file__, "_child", model, str(tp),
                                  str(threads), str(batch)], capture_output=True, text=True,
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"decode step, {Path(model).name}; load average {os.getloadavg()[0]:.1f}")
    print("| batch | TP=1, 1 thread | TP=1, 2 threads | TP=2, 1 thread/rank | "
          "TP=2 all-reduce per step |")
    print("|---:|---:|---:|---:|---:|")
    for batch in batches:
        r = {(x["tp"], x["threads"]): x for x in rows if x["batch"] == batch}
        two = r[2, 1]
        print(f"| {batch} | {r[1, 1]['step_ms']:.2f} ms | {r[1, 2]['step_ms']:.2f} ms | "
              f"{two['step_ms']:.2f} ms | {two['allreduce_ms']:.2f} ms "
              f"({100 * two['allreduce_ms'] / two['step_ms']:.0f} %) |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        model, tp, threads, batch = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(_steps_child(model, tp, threads, batch)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allreduce")
    a.add_argument("--hidden", type=int, default=576)
    s = sub.add_parser("steps")
    s.add_argument("--model", default=None)
    s.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    if args.what == "allreduce":
        bench_allreduce(args.hidden)
    else:
        bench_steps(args.model, args.batches)


if __name__ == "__main__":
    main()
