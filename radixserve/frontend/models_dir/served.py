"""One loaded model of the hub: its engine processes (a `ReplicaSet`, supervised and restarted
as in single-model ``serve``), its `AsyncLLM`, `ServingContext` and the ASGI app `build_app`
makes of them. The hub forwards requests to ``router`` in-process (no extra HTTP hop)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from dataclasses import dataclass, field

from radixserve.frontend.models_dir.catalog import ModelEntry, NotAModel

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ServedModel:
    """A started model. ``router`` is its app's `Router` (the hub's guard is in front of it);
    ``in_flight`` counts the hub requests forwarded to it and not yet ended."""

    entry: ModelEntry
    supervisor: object  # ReplicaSet
    ctx: object  # ServingContext
    metrics: object  # ServerMetrics
    router: object  # http.router.Router
    estimate_bytes: int
    loaded_at: float = field(default_factory=time.time)
    in_flight: int = 0

    @property
    def max_model_len(self) -> int:
        return self.ctx.max_model_len

    @property
    def is_dead(self) -> bool:
        client = self.ctx.engine.client
        return bool(client.dead)

    async def close(self, timeout: float = 10.0) -> None:
        """Shut its engines down (killed if they do not exit within ``timeout``): requests
        still open on it end with the engine's 503."""
        await self.supervisor.close(timeout=timeout)


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
    from radixserve.frontend.openai.serving import ServingContext
    from radixserve.frontend.pooling import resolve_embedding
    from radixserve.models.source import ModelSource
    from radixserve.tokenizer.tokenizer import load_tokenizer

    entry.check()
    try:
        source = ModelSource.resolve(entry.path)
        embedding = resolve_embedding(source, args.pooling, args.task)
        tables = await asyncio.to_thread(single.frontend_tables, load_tokenizer, source)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the client's bad name
        raise NotAModel(f"model '{entry.name}' cannot be loaded from {entry.path}: "
                        f"{type(exc).__name__}: {exc}") from None
    tokenizer, validator = tables
    builds = replica_builds(args.data_parallel_size, _make_build(args, entry, tokenizer),
                            args.threads)
    os.makedirs(folder, exist_ok=True)
    supervisor = ReplicaSet(builds, folder, args.startup_timeout, single.restart_policy(args),
                            routing_config(args))
    try:
        ready = await supervisor.start()
    except BaseException:
        await supervisor.close(timeout=5)  # the failed start's processes: none left behind
        raise
    try:
        tool_format, tool_parser = single.tool_parser(args.tool_call_parser, tokenizer)
        reranker = single.reranker(args.task, tokenizer)
        client = supervisor.client
        metrics = ServerMetrics(client, entry.name, ready.max_model_len)
        metrics.registry.register(ReplicaCollector(supervisor, entry.name))
        engine = AsyncLLM(client, tokenizer, ready.max_model_len, metrics)
        ctx = ServingContext(engine, entry.name, args.max_n, tool_parser,
                             single.reasoning(args), tool_call_grammar=not args.no_tool_call_grammar,
                             grammar_validator=validator,
                             structured_strict=args.structured_strict == "true",
                             max_prompts_per_request=args.max_prompts_per_request,
                             embedding=embedding, model_path=entry.path, reranker=reranker,
                             **({} if response_store is None else
                                {"response_store": response_store}))
        app = build_app(ctx, metrics, None, serve_limits(args))
    except BaseException:
        await supervisor.close(timeout=5)
        raise
    supervisor.watch(on_fatal, metrics.engine_restarts.inc)
    logger.info("model %s loaded (context %d, %d KV blocks, tool calls: %s)", entry.name,
                ready.max_model_len, ready.num_kv_blocks, tool_format)
    return ServedModel(entry, supervisor, ctx, metrics, app.router, estimate_bytes)


def _make_build(args, entry: ModelEntry, tokenizer):
    """``make_build(threads)`` of `replica_builds`, as single-model ``serve`` makes it."""
    from radixserve.cli_args import engine_kwargs

    if args.mock_engine:
        from radixserve.bench.mock_engine import MockEngine

        return lambda threads: functools.partial(
            MockEngine, tokenizer.vocab_size, args.max_model_len or 8192, args.mock_max_seqs,
            step_time=args.mock_step_ms / 1000)
    from radixserve.engine.core_proc import build_engine

    kwargs = engine_kwargs(args)
    return lambda threads: functools.partial(build_engine, {**kwargs, "threads": threads},
                                             entry.path)
