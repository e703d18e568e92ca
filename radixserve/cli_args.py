"""Shared CLI flags for the engine (model, KV pool, scheduler, device)."""

from __future__ import annotations

import argparse

from radixserve.config import PROPOSERS
from radixserve.arg_types import positive_int, positive_or_auto
from radixserve.kvdisk.args import add_kv_disk_args, kv_disk_kwargs


def kv_events_json(text: str) -> str:
    """``--kv-events-config``: checked here (a clear error at the command line), passed on as
    text (the engine process parses it with its replica rank)."""
    from radixserve.config import KVEventsConfig

    try:
        KVEventsConfig.parse(text)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="a .gguf file, a Hugging Face folder, or hf.co/OWNER/REPO[:QUANT] "
                        "(a GGUF on the Hugging Face hub, pulled into its cache on first use; "
                        "see `radixserve pull`) (default: embedded SmolLM2-135M)")
    g.add_argument("--offline", action="store_true",
                   help="never ask the hub: an hf.co/ --model must be pulled already (as "
                        "HF_HUB_OFFLINE=1)")
    g.add_argument("--mmproj", default=None, metavar="FILE",
                   help="a vision model's image encoder: llama.cpp's mmproj GGUF for a text "
                        "GGUF (default: the one *mmproj*.gguf beside the model, if any; an HF "
                        "folder carries its own vision tower)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--kv-cache-memory-gb", type=positive_or_auto, default=None,
                   metavar="GIB|auto",
                   help="memory budget of the paged KV pool, GiB. Default (auto): 40%% of the "
                        "memory available after the weights, divided between the engines "
                        "started on this machine (--data-parallel-size replicas, times "
                        "--max-loaded-models with --models-dir), at most what --max-num-seqs "
                        "requests of max_model_len tokens use, at least 1 GiB where that is "
                        "at most half of what is available; its pages are touched only as the "
                        "prefix cache fills. RADIXSERVE_KV_CACHE_MEMORY_GB sets a fixed default")
    g.add_argument("--state-cache-memory-gb", type=float, default=None,
                   help="memory budget of a hybrid model's recurrent states (Qwen3.5, Granite "
                        "4.0-H, ...: a live state per running request and the prefix cache's "
                        "snapshots), GiB. Default: a state and a boundary copy for each of "
                        "--max-num-seqs requests and as many snapshots, within 10%% of the "
                        "memory available after the weights (at least 1 GiB); pages are "
                        "touched only as states are used")
    g.add_argument("--kv-cache-dtype", default="auto",
                   choices=["auto", "float32", "float16", "bfloat16", "int8"],
                   help="element type of the KV pool. auto: float16 for float32 models at the "
                        "avx2 / avxvnni / avx512 / amx kernel levels (measured faster for long "
                        "contexts), else the model's dtype. float16 / bfloat16 halve the KV "
                        "memory and the bytes each token reads, int8 (a scale per token and "
                        "head) quarters them (CPU: needs the native kernels' attention)")
    g.add_argument("--num-kv-blocks", type=int, default=None,
                   help="explicit KV pool size in blocks (overrides the memory budget)")
    g.add_argument("--no-prefix-cache", action="store_true",
                   help="disable the radix prefix cache")
    add_kv_disk_args(g)
    g.add_argument("--max-num-seqs", type=int, default=64, help="max running requests per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget per step (decodes + prefill chunks)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "lpm"],
                   help="waiting order within a priority: arrival, or longest prefix match")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's window, capped by the tokens "
                        "the KV pool holds; a larger one than either is refused)")
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads of the engine (torch and the native kernels; default: the "
                        "CPUs this process may use, i.e. its affinity mask and cgroup quota)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA. On CPUs with AMX, bfloat16 "
                        "is ~1.7x the batched throughput, but its greedy output may then "
                        "depend on the batch (oneDNN's bf16 GEMM is not batch invariant)")
    g.add_argument("--quantization", default="auto",
                   choices=["auto", "none", "int8", "gguf", "16bit-stored"],
                   help="gguf: a GGUF file's quantized or 16-bit matrices (Q4_0 ... Q6_K, F16, "
                        "BF16) as stored, in native kernels: the file's weights in about the "
                        "file's memory. 16bit-stored: a float16 / bfloat16 Hugging Face "
                        "folder's linear weights in 16 bits (float32 activations). int8: every "
                        "linear requantized to int8 per channel (activations as two int8 "
                        "terms). All batch invariant, CPU only. auto: gguf for GGUF files with "
                        "quantized or 16-bit matrices, 16bit-stored for 16-bit folders, float "
                        "otherwise")
    g.add_argument("--seed", type=int, default=0, help="engine seed for unseeded requests")
    g.add_argument("--no-structured-fast-forward", action="store_true",
                   help="sample every token of a structured output, even those its grammar "
                        "forces (default: forced tokens are emitted without a forward each)")
    g.add_argument("--speculative", default=None,
                   choices=list(PROPOSERS),
                   help="speculative decoding: draft tokens and verify them in the same batched "
                        "forward. ngram: prompt lookup in the request's own prompt and output; "
                        "suffix: prompt lookup plus a suffix tree over earlier requests' "
                        "outputs; auto: suffix; draft: a smaller model with the same tokenizer "
                        "(--draft-model); mtp: the model's own multi-token-prediction "
                        "block (Qwen3.5 / 3.6, Qwen3-Next checkpoints that carry one). Greedy output is unchanged, sampling keeps its "
                        "distribution; each draft's length follows the acceptance measured "
                        "for its evidence and the measured step cost (0 where drafts do not "
                        "pay). Default: auto (draft with --draft-model); off turns it off")
    g.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="most tokens drafted per request and step (1..7)")
    g.add_argument("--no-speculative-adaptive", action="store_true",
                   help="always draft K tokens when the proposer has them (measurements)")
    g.add_argument("--tensor-parallel-size", type=positive_int, default=1, metavar="N",
                   help="ranks splitting each layer's attention heads and MLP (Megatron-style, "
                        "torch.distributed), each pinned to its share of the CPUs with its "
                        "own KV pool of its KV heads (--kv-cache-memory-gb is per rank, "
                        "--threads split between the ranks); rank 0 schedules and samples. N "
                        "must divide the heads and KV heads (the error names the valid sizes)")
    g.add_argument("--tp-all-reduce", default="auto", choices=["auto", "shm", "torch"],
                   help="how the ranks sum their outputs: shm (shared memory, one machine), "
                        "torch (torch.distributed gloo); auto: shm on x86-64 (measured faster)")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="the draft model of --speculative draft (implied when --speculative "
                        "is not given): a .gguf file or a Hugging Face folder with the "
                        "target's vocabulary (the same ids; it may have fewer). Its KV pool "
                        "takes a share of --kv-cache-memory-gb: both pools get the same "
                        "number of blocks")
    g.add_argument("--kv-events-config", type=kv_events_json, default=None, metavar="JSON",
                   help="publish the prefix cache's KV events (BlockStored, BlockRemoved, "
                        "AllBlocksCleared) on ZMQ as vLLM workers do, for KV-aware routers. "
                        "vLLM's fields: enable_kv_cache_events, publisher (zmq, null), "
                        "endpoint (tcp://127.0.0.1:5557, loopback: vLLM binds every "
                        "interface; replica r of --data-parallel-size adds r to the port), "
                        "replay_endpoint, buffer_steps, hwm (1000), max_queue_size, topic; "
                        "ours: allow_remote (true: a bind off loopback is allowed; the "
                        "sockets have no authentication), max_subscribers (16), wire_format "
                        "(map: vLLM's events since mid-2026, the default; array: before). "
                        "Block hashes are vLLM's sha256 ones: set "
                        "PYTHONHASHSEED to the routers' value")
    g.add_argument("--lora", type=lora_module, action="append", default=[],
                   metavar="NAME=PATH",
                   help="load a LoRA adapter at start (repeatable): a PEFT folder "
                        "(adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF "
                        "LoRA file; requests pick it by model NAME (or BASE:NAME) or a 'lora' "
                        "field")
    g.add_argument("--max-loras", type=positive_int, default=4,
                   help="LoRA adapters resident at once; beyond it the least recently used "
                        "one no request uses is evicted (read again from its path when named)")


def lora_module(text: str) -> tuple[str, str]:
    """``--lora NAME=PATH``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def engine_kwargs(args: argparse.Namespace) -> dict:
    """`engine_config`'s keyword arguments from the parsed flags (``serve``'s add the number
    of engines this machine runs, which share its memory: `local_engines`)."""
    kwargs = dict(block_size=args.block_size, kv_cache_memory_gb=args.kv_cache_memory_gb,
                  state_cache_memory_gb=args.state_cache_memory_gb,
                  num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  max_model_len=args.max_model_len, device=args.device, dtype=args.dtype,
                  quantization=args.quantization, threads=args.threads,
                  kv_cache_dtype=args.kv_cache_dtype,
                  seed=args.seed, enable_prefix_caching=not args.no_prefix_cache,
                  scheduling_policy=args.scheduling_policy,
                  structured_fast_forward=not args.no_structured_fast_forward,
                  speculative=args.speculative,
                  num_speculative_tokens=args.num_speculative_tokens,
                  speculative_adaptive=not args.no_speculative_adaptive,
                  tensor_parallel_size=args.tensor_parallel_size, tp_all_reduce=args.tp_all_reduce,
                  draft_model=args.draft_model, kv_events_config=args.kv_events_config,
                  lora_modules=dict(args.lora), max_loras=args.max_loras,
                  mmproj=args.mmproj)
    if hasattr(args, "data_parallel_size"):  # serve: LLM(...) takes no such argument
        kwargs["num_local_engines"] = local_engines(args)
    kwargs.update(kv_disk_kwargs(args, is_serve=hasattr(args, "data_parallel_size")))
    return kwargs


def local_engines(args: argparse.Namespace) -> int:
    """The engines ``serve`` may run on this machine at once, each sizing its default KV pool
    from the same free memory (engine/kv_budget.py ``num_local_engines``)."""
    from radixserve.engine.kv_budget import num_local_engines

    loaded = args.max_loaded_models if getattr(args, "models_dir", None) else 1
    return num_local_engines(args.data_parallel_size, loaded,
                             getattr(args, "distributed_executor_backend", "mp") == "ray")


# What a sampling flag not given falls back to, after the model's recommendation
_SAMPLING_BASE = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def add_sampling_args(parser: argparse.ArgumentParser, temperature: float, max_tokens: int,
                      repetition_penalty: float = 1.0) -> None:
    """The sampling flags. A flag not given takes the model's recommendation (a GGUF's
    ``general.sampling.*``), else the command's default given here (`sampling_params`)."""
    g = parser.add_argument_group(
        "sampling", "a flag not given takes the value the model's GGUF recommends "
                    "(general.sampling.*) if it has one, else the default shown")
    g.add_argument("--max-tokens", type=positive_int, default=None,
                   help=f"tokens to generate at most (default: {max_tokens})")
    g.add_argument("--temperature", type=float, default=None,
                   help=f"0: greedy (default: {temperature:g})")
    g.add_argument("--top-p", type=float, default=None, help="(default: 1.0)")
    g.add_argument("--top-k", type=int, default=None, help="-1: off (default: -1)")
    g.add_argument("--min-p", type=float, default=None, help="(default: 0.0)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help=f"> 1 discourages repeating tokens (default: {repetition_penalty:g})")
    g.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    g.add_argument("--ignore-eos", action="store_true")
    parser.set_defaults(sampling_defaults={"max_tokens": max_tokens, "temperature": temperature,
                                           "repetition_penalty": repetition_penalty})


def sampling_params(args: argparse.Namespace, recommended: dict | None = None):
    """The request's SamplingParams: each flag given wins, then ``recommended`` (the model's
    `recommended_sampling`), then the command's defaults. ValueError on a bad value."""
    from radixserve.sampling_params import SamplingParams

    values = {**_SAMPLING_BASE, **getattr(args, "sampling_defaults", {}), **(recommended or {})}
    values.update({k: getattr(args, k) for k in values if getattr(args, k, None) is not None})
    return SamplingParams(seed=args.sampling_seed, ignore_eos=args.ignore_eos, **values)
