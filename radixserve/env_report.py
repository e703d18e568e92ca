"""What runs here: ``radixserve env`` (the CLI; above the engine, whose start-up line is the
built model's ``KernelPlan.startup_line``, models/native_stack.py).

It says which CPU kernel level was chosen (and why), what the linear layers, the attention and
the decoder layers would compute with, and how many threads the engine uses, so a slow path is
never a silent one. It works from the model's metadata alone (no weights are loaded); whether
the decoder layers run one native call each is the build's own rule
(``native_stack.python_layers_reason``) on those facts.
"""

from __future__ import annotations

import platform
from importlib import metadata

from radixserve.cpu import threads as cpu_threads
from radixserve.kernels import native

_PACKAGES = ("radixserve", "torch", "numpy", "gguf", "tokenizers", "safetensors", "llguidance",
             "fastapi", "uvicorn", "msgspec", "pyzmq", "ray")


def layer_plan(quantization: str, attention: str, kernels: str | None, python_layers: str | None,
               stored: tuple[str, ...] = ()) -> dict:
    """Per layer type, what computes it: ``quantization`` and ``attention`` are resolved names
    ("none" / "int8" / "gguf"; "cpu_native" / "torch"), ``kernels`` the loaded level or None,
    ``stored`` the GGUF file's matrix types (``stored_types``); ``python_layers``: why the
    decoder layers run as Python layers, None where one native call per layer runs
    (``python_layers_of``)."""
    from radixserve.models.native_stack import ONE_CALL

    native_kernel = f"native ({kernels})" if kernels else "torch"
    from radixserve.layers.block_linear import tile_note

    blocks = (f"GGUF blocks as stored ({', '.join(stored) or '?'}), native ({kernels})"
              f"{tile_note(stored, kernels)}")
    half = f"16 bits as stored, float32 activations, native ({kernels})"
    linears = {"none": "float (torch)", "int8": f"int8, native ({kernels})",
               "gguf": blocks, "16bit-stored": half}[quantization]
    return {
        "linear layers (qkv, o, gate_up, down)": linears,
        "lm_head": {"none": "float (torch)", "int8": f"int8, native ({kernels})",
                    "gguf": f"as stored, native ({kernels})", "16bit-stored": half}[quantization],
        "embedding": ("stored rows, dequantized per lookup" if quantization == "gguf"
                      else "float lookup (torch)"),
        "attention": (f"cpu_native: paged, native ({kernels})" if attention == "cpu_native"
                      else "torch: paged, SDPA"),
        "RMSNorm, rotary, SiLU / GELU": native_kernel,
        "decoder layers": (ONE_CALL if python_layers is None
                           else f"Python layers ({python_layers})"),
    }


def python_layers_of(config, quantization: str, attention: str,
                     kernels: str | None) -> str | None:
    """Why a float32 CPU model of ``config`` would run Python layers (None: one native call
    per layer), by the rule the build applies (``plan_kernels``): a family with no native layer
    call (its class's ``layers_in_python``: Qwen3.5's), else ``python_layers_reason``: sparse
    MoE blocks, partial rotary or float linears keep the Python layers."""
    from radixserve.models.native_stack import python_layers_reason
    from radixserve.models.registry import get_model_class

    own = getattr(get_model_class(config.architecture), "layers_in_python", None)
    if own is not None and kernels:
        return own
    partial = config.rotary_dim is not None and config.rotary_dim != config.head_dim
    return python_layers_reason(kernels, attention, True, config.moe is not None,
                                quantization != "none" and not partial)


def stored_types(reader) -> tuple[str, ...]:
    """The types of a GGUF file's matrices (2-D tensors, 3-D expert tensors), most frequent
    first; () for None."""
    if reader is None:
        return ()
    counts: dict[str, int] = {}
    for t in reader.tensors:
        if len(t.shape) in (2, 3):  # 3-D: a MoE layer's experts
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return tuple(sorted(counts, key=lambda name: -counts[name]))


def report(model: str | None, quantization: str = "auto",
           draft_model: str | None = None) -> str:
    """The text ``radixserve env`` prints. Reads the model's metadata, never its weights;
    with ``draft_model``, also that model's shape and its vocabulary check (ValueError if
    its vocabulary does not fit)."""
    import torch

    from radixserve.layers.attn_backends import resolve_attn_backend
    from radixserve.models.half_stored import checkpoint_dtype
    from radixserve.models.loader import load_model_config, open_gguf
    from radixserve.models.quantization import resolve_quantization
    from radixserve.models.source import ModelSource
    from radixserve.engine.kv_budget import estimated_weight_bytes
    from radixserve.kvdisk.args import env_lines as kv_disk_lines
    from radixserve.runner.kv_cache import resolve_kv_dtype

    lines = ["versions:"]
    for name in _PACKAGES:
        try:
            lines.append(f"  {name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"  {name} (not installed)")
    lines.append(f"  python {platform.python_version()} on {platform.machine()} "
                 f"{platform.system()}")
    lines += ["cpu:", f"  {_cpu_model()}"]
    info = native.describe()
    lines.append(f"  features the kernel levels use: {' '.join(info.cpu_flags) or 'none found'}")
    lines += ["kernels:",
              f"  levels this CPU runs: {', '.join(info.runnable) or 'none'}",
              f"  levels installed: {', '.join(info.built) or 'none'}",
              f"  selected: {info.level or 'none (the torch paths)'}: {info.reason}"
              + (" (AMX tiles on)" if info.amx_tiles else "")]
    if info.tuning:
        lines.append(f"  tuning: {info.tuning}")
    if info.path:
        lines.append(f"  library: {info.path}")
    affinity, quota = cpu_threads.affinity_cpus(), cpu_threads.cgroup_cpu_limit()
    lines += ["threads:", f"  engine: {cpu_threads.engine_threads(None)} (affinity {affinity}, "
                          f"cgroup quota {quota if quota is not None else 'none'}; "
                          "--threads overrides)",
              "  serve: one fewer for each CPU other processes keep busy, back when they are free "
              "(engine/thread_governor.py; not with --threads)",
              f"  torch in this process: {torch.get_num_threads()}"]
    source = ModelSource.resolve(model)
    reader = open_gguf(source.path) if source.kind == "gguf" else None
    config = load_model_config(source, reader)
    cpu = torch.device("cpu")
    stored = checkpoint_dtype(source)
    resolved = resolve_quantization(quantization, cpu, reader, stored)
    kv_dtype = resolve_kv_dtype("auto", cpu, torch.float32)
    attention = resolve_attn_backend("auto", cpu, torch.float32, kv_dtype)
    lines += [f"model: {source.path} ({config.architecture}, {config.num_layers} layers, "
              f"quantization {quantization} -> {resolved}, on cpu float32)"]
    python_layers = python_layers_of(config, resolved, attention, info.level)
    for layer, how in layer_plan(resolved, attention, info.level, python_layers,
                                 stored_types(reader)).items():
        lines.append(f"  {layer}: {how}")
    lines.append(f"  KV cache: {str(kv_dtype).removeprefix('torch.')} (--kv-cache-dtype auto)")
    lines += recurrent_state_lines(config)
    lines += image_lines(source.path)
    widened = resolved == "none" and stored in (torch.float16, torch.bfloat16)
    lines += kv_pool_lines(config, kv_dtype, estimated_weight_bytes(source.kind, source.path,
                                                                    widened))
    if resolved == "gguf":
        from radixserve.models.gguf_stored import memory_plan

        plan = memory_plan((t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
                           for t in reader.tensors)
        mb = 1e6
        lines.append(f"  memory: weights {plan.steady / mb:.1f} MB as stored (file "
                     f"{plan.file / mb:.1f} MB), at most {plan.peak / mb:.1f} MB while "
                     "loading; plus the KV pool (--kv-cache-memory-gb)")
        from radixserve.models.packed_cache import cache_line

        lines.append(cache_line())
    if resolved == "16bit-stored":
        from radixserve.models.half_stored import stored_bytes

        half, floats = stored_bytes(source, config.tie_word_embeddings)
        lines.append(f"  memory: linear weights {half / 1e6:.1f} MB in 16 bits as stored, "
                     f"{floats / 1e6:.1f} MB float32 (norms, an untied embedding); plus the KV pool "
                     "(--kv-cache-memory-gb)")
    lines += tensor_parallel_lines(config, reader)
    lines += kv_disk_lines()
    if draft_model is not None:
        lines += _draft_lines(draft_model, source, config, reader, kv_dtype)
    return "\n".join(lines)


def recurrent_state_lines(config) -> list[str]:
    """A hybrid model's recurrent layers and the bytes of one request's states (the state
    pool's slot; engine/build.py sizes the pool, --state-cache-memory-gb)."""
    import torch

    from radixserve.runner.recurrent_state import bytes_per_slot

    layout = config.linear_attn
    if layout is None:
        return []
    per_slot = bytes_per_slot(config, torch.float32)
    return [f"  recurrent states: {len(layout.linear_layers)} {type(layout).__name__} layers, "
            f"{per_slot / 2**20:.1f} MiB a slot (a running request holds one, with the prefix "
            "cache a boundary copy, and the cache keeps snapshots); the pool: "
            "--state-cache-memory-gb, by default 10% of the memory available after the weights"]


def image_lines(path: str) -> list[str]:
    """Where a vision model's image encoder would come from (engine/vision_setup.py: the
    mmproj beside a GGUF, or a folder's own tower; metadata only) and its attention's type."""
    import json
    import os

    import torch

    from radixserve.gguf_reader import open_gguf
    from radixserve.models.vision.attention_dtype import (vision_attention_dtype,
                                                          vision_matmul_dtype)
    from radixserve.models.vision.load import GGUF_PROJECTORS, HF_ARCHITECTURES
    from radixserve.multimodal.mmproj_path import find_mmproj

    mmproj = find_mmproj(path)
    if mmproj is not None:
        field = open_gguf(mmproj).fields.get("clip.projector_type")
        kind = None if field is None else field.contents()
        where = f"{os.path.basename(mmproj)} beside the model (projector {kind}" + (
            ")" if kind in GGUF_PROJECTORS else ": not supported yet, not used)")
    else:
        config = os.path.join(path, "config.json")
        if not os.path.isfile(config):
            return []
        with open(config, encoding="utf-8") as f:
            archs = json.load(f).get("architectures") or []
        known = [a for a in archs if a in HF_ARCHITECTURES]
        if not known:
            return []
        where = f"the folder's vision tower ({known[0]})"
    cpu = torch.device("cpu")
    dtype, why = vision_attention_dtype(cpu, torch.float32)
    matmul, because = vision_matmul_dtype(cpu, torch.float32)
    return [f"  images: {where}; vision attention {str(dtype).removeprefix('torch.')} ({why}), "
            f"16-bit matrices in {str(matmul).removeprefix('torch.')} ({because})"]


def kv_pool_lines(config, kv_dtype, weights: int, available: int | None = None) -> list[str]:
    """The KV pool ``radixserve serve --model`` sizes for ``config`` with its default flags
    (one engine, --max-num-seqs 64, the model's window; engine/kv_sizing.py): on the memory
    ``available`` (default: the system's now) less ``weights``, the bytes the model's
    weights are estimated to take (not loaded here)."""
    from radixserve.config import engine_config
    from radixserve.core.kv.kv_groups import KVGroups
    from radixserve.cpu.memory import mem_available
    from radixserve.engine.kv_sizing import budget_for, pool_figures
    from radixserve.runner.kv_cache import bytes_per_token

    engine = engine_config()
    now = mem_available() if available is None else available
    kv_model = config.kv_view()
    per_token = bytes_per_token(kv_model, engine.cache.block_size, kv_dtype)
    budget = budget_for(engine, config, per_token, lambda: now - weights)
    groups = KVGroups.from_windows([config.layer_window(i) for i in config.attention_layers])
    try:
        _, line = pool_figures(kv_model, engine.cache, kv_dtype, groups, budget)
    except ValueError as exc:  # no block fits: say so, the rest of the report stands
        line = f"KV pool: none fits: {exc}"
    basis = (f"    (memory available now {now / 2**30:.2f} GiB, the weights about "
             f"{weights / 2**30:.2f} GiB from their files; serve's defaults: --max-num-seqs 64, "
             "one engine; --kv-cache-memory-gb GIB fixes it)")
    return [f"  {line}", basis]


def tensor_parallel_lines(config, reader=None) -> list[str]:
    """What ``--tensor-parallel-size`` would run: the sizes this model splits into and the
    all-reduce ``auto`` picks (parallel/comm.py)."""
    from radixserve.parallel.comm import describe_all_reduce, resolve_all_reduce
    from radixserve.models.tp_shard import (TP_ARCHITECTURES, row_parallel_block,
                                                 valid_tp_sizes)

    if config.architecture not in TP_ARCHITECTURES or config.moe is not None:
        sizes = "1 (tensor parallel splits dense Llama-family models only)"
    else:
        sizes = ", ".join(map(str, valid_tp_sizes(config, row_parallel_block(reader))))
    auto = describe_all_reduce(resolve_all_reduce("auto"))
    return ["tensor parallel:", f"  sizes this model splits into: {sizes}",
            f"  all-reduce (--tp-all-reduce auto): {auto}"]


def _draft_lines(path: str, source, config, reader, kv_dtype) -> list[str]:
    from radixserve.engine.draft_setup import open_draft
    from radixserve.runner.kv_cache import bytes_per_block

    draft = open_draft(path, source, config, reader)
    d, t = (bytes_per_block(c, 16, kv_dtype) for c in (draft.config, config))
    return [f"draft model (--speculative draft): {draft.source.path} "
            f"({draft.config.architecture}, {draft.config.num_layers} layers, vocab "
            f"{draft.config.vocab_size}: the model's ids)",
            f"  KV pool: {100 * d / (d + t):.0f}% of --kv-cache-memory-gb (as many blocks as "
            "the model's pool)"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
