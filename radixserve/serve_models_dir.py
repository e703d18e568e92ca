"""``radixserve serve --models-dir DIR``: the many-models server, composed here (above
``frontend`` and ``cluster``, as `serve` is): `frontend.models_dir.hub.ModelHub` decides what is
loaded; `start_served_model` starts one model the way single-model ``serve`` starts its one.

No engine starts up front; each model's engines start on its first request. Shutdown
(SIGINT/SIGTERM) drains in-flight requests as single-model ``serve`` does, then unloads every
model (no process left)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import math
import os
import shutil
import sys
import tempfile

from radixserve.frontend.models_dir.catalog import ModelEntry, NotAModel
from radixserve.frontend.models_dir.served import ServedModel
from radixserve.frontend.next_turn import NextTurnWarmer

logger = logging.getLogger(__name__)

def serve_models_dir(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; the exit status."""
    from radixserve.cpu.threads import limit_api_threads
    from radixserve.frontend.models_dir.catalog import Catalog

    limit_api_threads()  # before the tokenizers' imports load numpy (and OpenBLAS)

    if args.distributed_executor_backend == "ray":
        raise SystemExit("radixserve: error: --models-dir runs local engines only "
                         "(not with --distributed-executor-backend ray)")
    try:
        catalog = Catalog(args.models_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None
    import uvloop

    return uvloop.run(_serve(args, catalog))


async def _serve(args, catalog) -> int:
    import uvicorn

    from radixserve import serve as single
    from radixserve.frontend.http.connection_guard import guarded_protocol, raise_fd_limit
    from radixserve.frontend.http.host_check import host_policy, startup_warning
    from radixserve.frontend.http.limits import serve_limits
    from radixserve.frontend.models_dir.hub import ModelHub
    from radixserve.engine.kv_budget import estimate_bytes as kv_estimate_bytes
    from radixserve.frontend.models_dir.memory import GIB, MemoryPolicy
    from radixserve.frontend.models_dir.routes import build_hub_app
    from radixserve.frontend.responses.store import ResponseStore

    try:
        store = ResponseStore(args.response_store, args.response_store_max)
    except ValueError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 1
    policy = MemoryPolicy(kv_estimate_bytes(args.kv_cache_memory_gb), args.data_parallel_size,
                          None if args.models_memory_gb is None
                          else int(args.models_memory_gb * GIB))
    tmp = tempfile.mkdtemp(prefix="radixserve-hub-")
    hub = ModelHub(catalog, args, tmp, policy,
                   functools.partial(start_served_model, response_store=store))
    limits = serve_limits(args)
    hosts = host_policy(args)
    app = build_hub_app(hub, args.api_key, limits, hosts)
    if warning := startup_warning(hosts):
        print(warning, file=sys.stderr, flush=True)
    edge = limits.connections
    raise_fd_limit((edge.max_connections or 65536) + 1024)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            loop="none", http=guarded_protocol(edge),
                            timeout_keep_alive=edge.keep_alive_timeout,
                            timeout_graceful_shutdown=args.drain_timeout + single.DRAIN_GRACE_S)
    server = single.server_class()(config, app.router.drain, args.drain_timeout)
    hub.start_reaper()
    single.settle_gc()
    names = list(catalog.entries())
    idle = "never" if math.isinf(hub.idle_s) else f"after {hub.idle_s:g} s idle"
    print(f"radixserve: serving {len(names)} models from {args.models_dir} on "
          f"http://{args.host}:{args.port} (each loaded on its first request; at most "
          f"{hub.max_loaded} at once; unloaded {idle}): {', '.join(names) or '(none yet)'}",
          file=sys.stderr, flush=True)
    try:
        await server.serve()
    finally:
        await hub.close()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


async def start_served_model(entry: ModelEntry, args, folder: str, estimate_bytes: int,
                             on_fatal, response_store=None) -> ServedModel:
    """Start ``entry``'s engines with the server's engine options (``args``) and build its app.
    ``folder`` is a fresh folder for its sockets. `NotAModel` when its files cannot be read as
    a model, RuntimeError when the engine fails to start; either way no process is left.
    ``on_fatal(reason)``: its engines died for good (the hub then drops it)."""
    from radixserve import serve as single
    from radixserve.cluster.dp_args import replica_builds, routing_config
    from radixserve.cluster.dp_metrics import ReplicaCollector
    from radixserve.cluster.replica_set import ReplicaSet
    from radixserve.frontend.app import build_app
    from radixserve.frontend.async_llm import AsyncLLM
    from radixserve.frontend.http.limits import serve_limits
    from radixserve.frontend.http.metrics import ServerMetrics
    from radixserve.frontend.media.policy import media_policy
    from radixserve.frontend.openai.serving import ServingContext
    from radixserve.frontend.reasoning_budget import budget_policy
    from radixserve.multimodal.select import image_processor

    entry.check()
    tables = asyncio.ensure_future(_frontend_tables(entry, args))  # beside the engine's load
    vocab_size = (await tables)[1].vocab_size if args.mock_engine else None  # the mock's
    builds = replica_builds(args.data_parallel_size, _make_build(args, entry, vocab_size),
                            args.threads)
    os.makedirs(folder, exist_ok=True)
    supervisor = ReplicaSet(builds, folder, args.startup_timeout, single.restart_policy(args),
                            routing_config(args))
    try:
        ready = await supervisor.start()
        embedding, tokenizer, validator = await tables
    except BaseException:
        await asyncio.wait([tables])
        await supervisor.close(timeout=5)  # the failed start's processes: none left behind
        shutil.rmtree(folder, ignore_errors=True)
        if not tables.cancelled() and isinstance(tables.exception(), NotAModel):
            raise tables.exception() from None  # the file's fault more than the engine's
        raise
    try:
        tool_format, tool_parser = single.tool_parser(args.tool_call_parser, tokenizer)
        _, reasoning = single.reasoning_parser(args.reasoning_parser, tokenizer)
        reranker = single.reranker(args.task, tokenizer)
        client = supervisor.client
        metrics = ServerMetrics(client, entry.name, ready.max_model_len)
        metrics.registry.register(ReplicaCollector(supervisor, entry.name))
        engine = AsyncLLM(client, tokenizer, ready.max_model_len, metrics)
        ctx = ServingContext(engine, entry.name, args.max_n, tool_parser, reasoning,
                             tool_call_grammar=not args.no_tool_call_grammar,
                             next_turn=NextTurnWarmer(not args.no_warm_next_turn),
                             grammar_validator=validator,
                             structured_strict=args.structured_strict == "true",
                             max_prompts_per_request=args.max_prompts_per_request,
                             embedding=embedding, model_path=entry.path, reranker=reranker,
                             max_response_bytes=single.max_response_bytes(args),
                             reasoning_budget=budget_policy(args, reasoning),
                             media=media_policy(args),
                             images=(image_processor(entry.path, None, tokenizer,
                                                     args.image_max_tokens)
                                     if ready.takes_images else None),
                             **({} if response_store is None else
                                {"response_store": response_store}))
        metrics.registry.register(ctx.next_turn.collector(entry.name))
        app = build_app(ctx, metrics, None, serve_limits(args))
    except BaseException:
        await supervisor.close(timeout=5)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    supervisor.watch(on_fatal, metrics.engine_restarts.inc)
    logger.info("model %s loaded (context %d, %d KV blocks, tool calls: %s)", entry.name,
                ready.max_model_len, ready.num_kv_blocks, tool_format)
    return ServedModel(entry, supervisor, ctx, metrics, app.router, estimate_bytes, folder)


async def _frontend_tables(entry: ModelEntry, args):
    """(embedding setup, tokenizer, grammar validator) of ``entry``, read on a worker thread;
    `NotAModel` when its files cannot be read as a model."""
    from radixserve import serve as single
    from radixserve.frontend.pooling import resolve_embedding
    from radixserve.models.source import ModelSource
    from radixserve.tokenizer.tokenizer import load_tokenizer

    try:
        source = ModelSource.resolve(entry.path)
        embedding = resolve_embedding(source, args.pooling, args.task)
        tables = await asyncio.to_thread(single.frontend_tables, load_tokenizer, source)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the client's bad name
        raise NotAModel(f"model '{entry.name}' cannot be loaded from {entry.path}: "
                        f"{type(exc).__name__}: {exc}") from None
    return (embedding, *tables)


def _make_build(args, entry: ModelEntry, vocab_size: int | None):
    """``make_build(threads)`` of `replica_builds`, as single-model ``serve`` makes it."""
    from radixserve.cli_args import engine_kwargs

    if args.mock_engine:
        from radixserve.bench.mock_engine import MockEngine

        return lambda threads: functools.partial(
            MockEngine, vocab_size, args.max_model_len or 8192, args.mock_max_seqs,
            step_time=args.mock_step_ms / 1000)
    from radixserve.engine.core_proc import build_engine

    kwargs = {**engine_kwargs(args), "mmproj": None}  # each model's own, found beside it
    return lambda threads: functools.partial(build_engine, {**kwargs, "threads": threads},
                                             entry.path)
