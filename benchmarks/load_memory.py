"""The memory a GGUF model takes loaded as stored (``--quantization gguf``): the loader's own
arithmetic (``gguf_stored.memory_plan``, from the tensor table alone), and with ``--load`` the
load measured beside it (peak and steady RSS of this process, minus what it held before).

    .venv/bin/python benchmarks/load_memory.py --table llama2-7b-q4_k_m
    .venv/bin/python benchmarks/load_memory.py --gguf FILE.gguf --load

``--table llama2-7b-q4_k_m`` is Llama-2-7B's tensor table as llama.cpp's Q4_K_M recipe types it
(attn_v and ffn_down in Q6_K on the layers ``use_more_bits`` picks, the head Q6_K, the rest
Q4_K): the most common 7B download, accounted without downloading it.
"""

from __future__ import annotations

import argparse
import resource
import time

from radixserve.models.gguf_stored import memory_plan

MB = 1e6


def llama2_7b_q4_k_m() -> list[tuple[str, str, tuple[int, ...]]]:
    layers, hidden, inter, vocab = 32, 4096, 11008, 32000

    def more_bits(i: int) -> bool:  # llama.cpp's use_more_bits
        return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2

    table = [("token_embd.weight", "Q4_K", (vocab, hidden)),
             ("output_norm.weight", "F32", (hidden,)), ("output.weight", "Q6_K", (vocab, hidden))]
    for i in range(layers):
        big = "Q6_K" if more_bits(i) else "Q4_K"
        table += [(f"blk.{i}.attn_norm.weight", "F32", (hidden,)),
                  (f"blk.{i}.ffn_norm.weight", "F32", (hidden,)),
                  (f"blk.{i}.attn_q.weight", "Q4_K", (hidden, hidden)),
                  (f"blk.{i}.attn_k.weight", "Q4_K", (hidden, hidden)),
                  (f"blk.{i}.attn_v.weight", big, (hidden, hidden)),
                  (f"blk.{i}.attn_output.weight", "Q4_K", (hidden, hidden)),
                  (f"blk.{i}.ffn_gate.weight", "Q4_K", (inter, hidden)),
                  (f"blk.{i}.ffn_up.weight", "Q4_K", (inter, hidden)),
                  (f"blk.{i}.ffn_down.weight", big, (hidden, inter))]
    return table


def gguf_table(path: str) -> list[tuple[str, str, tuple[int, ...]]]:
    import gguf

    reader = gguf.GGUFReader(path)
    return [(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
            for t in reader.tensors]


def _rss_kb() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in kB."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                values[line.split(":")[0]] = int(line.split()[1])
    return values["VmRSS"], values["VmHWM"]


def measure(path: str) -> tuple[float, float, float]:
    """(load seconds, peak MB, steady MB) of loading ``path`` as stored, beyond the baseline
    (torch and radixserve imported, the file's header parsed)."""
    import gc

    import torch

    from radixserve.models.loader import load_model, load_model_config, open_gguf
    from radixserve.models.source import ModelSource

    source = ModelSource.resolve(path)
    reader = open_gguf(source.path)
    config = load_model_config(source, reader)
    gc.collect()
    base, _ = _rss_kb()
    resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    model = load_model(source, config, torch.device("cpu"), torch.float32, reader, False, "gguf")
    seconds = time.perf_counter() - t0
    gc.collect()
    steady, peak = _rss_kb()
    assert model is not None
    return seconds, (peak - base) * 1e3 / MB, (steady - base) * 1e3 / MB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--table", choices=["llama2-7b-q4_k_m"])
    group.add_argument("--gguf")
    parser.add_argument("--load", action="store_true", help="also load it and measure")
    args = parser.parse_args()
    table = llama2_7b_q4_k_m() if args.table else gguf_table(args.gguf)
    plan = memory_plan(table)
    print(f"tensor data in the file     {plan.file / MB:9.1f} MB")
    for name, size in sorted(plan.by_type.items()):
        print(f"  packed {name:6s}             {size / MB:9.1f} MB")
    print(f"packed matrices             {plan.weights / MB:9.1f} MB")
    print(f"stored embedding rows       {plan.embedding / MB:9.1f} MB")
    print(f"float tensors (+ int8)      {plan.floats / MB:9.1f} MB")
    print(f"steady (weights)            {plan.steady / MB:9.1f} MB = "
          f"{plan.steady / plan.file:.3f} x the file")
    print(f"transient at load           {plan.transient / MB:9.1f} MB")
    print(f"peak at load (weights)      {plan.peak / MB:9.1f} MB = file + "
          f"{(plan.peak - plan.file) / MB:.1f} MB (+ the KV pool)")
    if args.load and args.gguf:
        seconds, peak, steady = measure(args.gguf)
        print(f"measured: load {seconds:.2f} s, peak +{peak:.1f} MB, steady +{steady:.1f} MB "
              f"(RSS beyond this process before the load)")


if __name__ == "__main__":
    main()
