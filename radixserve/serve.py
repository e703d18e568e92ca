"""``radixserve serve``: start the engine-core process, wait until it is ready, serve HTTP.

The API process binds two ipc:// sockets in a private temp folder and spawns the engine-core
process, which connects, loads the model and answers EngineReady; only then does the port open.
(``--distributed-executor-backend ray``: tcp:// sockets, and each engine a Ray actor in a
placement group, `radixserve.cluster.ray_executor`.)
If the engine process dies, pending requests end at once with a 503-style error and the
`EngineSupervisor` starts a new one (bounded attempts with back-off; /health is 503 until it is
ready); with ``--no-engine-restart``, or when the attempts are used up, the server exits
non-zero instead. SIGINT/SIGTERM: uvicorn stops accepting, drains in-flight requests for up
to ``--drain-timeout`` seconds (a response still open then ends in its API's error shape:
`frontend.http.drain`), then the engine is told to shut down and is joined (killed if it does
not exit), so no orphan process is left.

This module is the wiring (`serve_args` holds the flags). Importing it loads the tokenizer's
numpy: the CLI calls `cpu.threads.limit_api_threads` before it does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import shutil
import signal
import sys
import tempfile

import uvicorn
import uvloop

from radixserve import startup_trace
from radixserve.bench.mock_engine import MockEngine
from radixserve.cli_args import engine_kwargs
from radixserve.cluster.dp_args import ray_config, replica_builds, routing_config
from radixserve.cluster.dp_metrics import ReplicaCollector
from radixserve.cluster.engine_launcher import LocalLauncher
from radixserve.cluster.engine_prestart import PrestartedEngine
from radixserve.cluster.engine_supervisor import RestartPolicy
from radixserve.cluster.ray_executor import RayPlacement, require_ray
from radixserve.cluster.replica_set import ReplicaSet
from radixserve.cpu.memory import trim_heap
from radixserve.engine.core_proc import QUIET_S, build_engine
from radixserve.engine.kv_events import with_replica_rank
from radixserve.frontend.app import build_app
from radixserve.frontend.async_llm import AsyncLLM
from radixserve.frontend.cross_encoder import cross_encoder_reranker, resolve_task
from radixserve.frontend.http.connection_guard import guarded_protocol, raise_fd_limit
from radixserve.frontend.http.host_check import host_policy, startup_warning
from radixserve.frontend.http.limits import serve_limits
from radixserve.frontend.http.lora_routes import lora_updates
from radixserve.frontend.http.metrics import ServerMetrics
from radixserve.frontend.media.policy import media_policy
from radixserve.multimodal.select import image_processor
from radixserve.frontend.next_turn import NextTurnWarmer
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.parsers import get_tool_parser
from radixserve.frontend.parsers.detect import reasoning_parser_for, resolve_tool_format
from radixserve.frontend.pooling import resolve_embedding
from radixserve.frontend.reasoning_budget import budget_policy
from radixserve.frontend.rerank import Reranker
from radixserve.frontend.responses.store import ResponseStore
from radixserve.gguf_reader import open_gguf
from radixserve.models.cross_encoder_config import cross_encoder_config
from radixserve.models.lora_check import check_lora_modules
from radixserve.models.source import ModelSource
from radixserve.serve_args import add_serve_args, max_response_bytes
from radixserve.structured.validator import GrammarValidator, grammar_validator
from radixserve.tokenizer.tokenizer import load_tokenizer

__all__ = ["add_serve_args", "serve"]

logger = logging.getLogger(__name__)


def serve(args: argparse.Namespace, prestarted: PrestartedEngine | None = None) -> int:
    """Serve ``args.model`` (a local path: the CLI resolves hub references) until
    SIGINT/SIGTERM; the exit status. ``prestarted``: the engine process the CLI started
    before it parsed the flags (`engine_prestart`), which the first engine start takes."""
    if args.distributed_executor_backend == "ray":
        require_ray()  # at once, not after the tokenizer has loaded
    source = ModelSource.resolve(args.model)
    args.task = _task(source, args.task)
    reader = _metadata(source)  # this process's one parse of a GGUF's metadata
    embedding = _embedding_setup(source, args, reader)
    try:  # each --lora checked as a run-time load is, before any process starts
        check_lora_modules(source.path, args.lora)
        args.lora_updates = lora_updates(args.enable_lora_runtime_updates,
                                         args.lora_adapters_dir)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None
    kwargs = engine_kwargs(args)
    tables = functools.partial(_frontend_tables, load_tokenizer, source, reader)
    if args.mock_engine:
        tokenizer, _ = loaded = tables()  # the mock needs the vocabulary size
        tables = functools.partial(tuple, loaded)

        def make_build(threads):
            return functools.partial(MockEngine, tokenizer.vocab_size,
                                     args.max_model_len or 8192, args.mock_max_seqs,
                                     step_time=args.mock_step_ms / 1000)
    else:
        def make_build(threads):  # built in the engine process (core_proc.py)
            return functools.partial(build_engine, {**kwargs, "threads": threads}, args.model)

    builds = replica_builds(args.data_parallel_size, make_build, args.threads,
                            ray_config(args))
    if len(builds) > 1:  # each replica's KV events on its own port
        builds = [functools.partial(with_replica_rank, r, b) for r, b in enumerate(builds)]
    name = args.served_model_name or source.name
    return uvloop.run(_serve(args, builds, tables, name, embedding, prestarted))


def _frontend_tables(load_tokenizer, source, reader=None):
    """What the API process derives from the model before it serves, while the engine process
    loads it: the tokenizer with its token -> bytes table, and the grammar validator (whose
    tokenizer view, seconds on a 262k vocabulary, it builds once serving and quiet).
    ``reader``: the GGUF's open reader, to reuse."""
    with startup_trace.span("tokenizer", profile=True):
        tokenizer = load_tokenizer(source, reader)
    with startup_trace.span("detokenizer table", profile=True):
        tokenizer.detokenizer([])  # the token → bytes table now, not on the first request
    trim_heap()  # what building them freed (84 MB for a 152k vocabulary)
    if cross_encoder_config(source) is not None:  # it scores pairs: no grammar over its vocab
        return tokenizer, GrammarValidator()
    return tokenizer, grammar_validator(tokenizer)  # (its tokenizer view: when quiet)


def _tool_parser(requested: str, tokenizer):
    """(name, parser) of the tool-call format: `requested`, or with "auto" the one the
    tokenizer's chat template writes (`detect.resolve_tool_format`); logged once. Mutates the
    tokenizer: the format's markers that are special tokens decode as text from now on."""
    name, why = resolve_tool_format(requested, tokenizer.chat_template)
    logger.info("tool-call format: %s (%s)", name, why)
    parser = get_tool_parser(name)
    kept = tokenizer.decode_as_text(parser.format.markers)
    if kept:
        logger.info("special tokens decoded as text for the tool-call parser: %s",
                    " ".join(kept))
    return name, parser


def _reasoning_parser(requested: str | None, tokenizer):
    """(name, parser) of ``--reasoning-parser`` (None, None: none): `requested`, or with "auto"
    the one the tokenizer's chat template shows (`detect.reasoning_parser_for`); logged once.
    Mutates the tokenizer: the parser's tags that are special tokens decode as text."""
    name, parser, why = reasoning_parser_for(requested, tokenizer)
    logger.info("reasoning parser: %s (%s)", name or "none", why)
    return name, parser


def _model_path(args) -> str | None:
    return ModelSource.resolve(args.model).path


def _metadata(source):
    """The GGUF's open reader (its metadata parsed once, for the pooling check and the
    tokenizer), None for a folder; an unreadable file stops the server here."""
    if source.kind != "gguf":
        return None
    try:
        return open_gguf(source.path)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None


def _embedding_setup(source, args, reader=None):
    try:
        return resolve_embedding(source, args.pooling, args.task, reader)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None


def _task(source, task: str) -> str:
    """``--task``, with auto resolved to rerank for a cross-encoder folder."""
    try:
        return resolve_task(source, task)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None


def _cross_encoder(args, max_model_len: int):
    """With --task rerank on a cross-encoder folder, its pair tokenizer; None otherwise."""
    if args.task != "rerank" or args.mock_engine:
        return None

    reranker = cross_encoder_reranker(_model_path(args), max_model_len)
    if reranker is not None:
        logger.info("reranker: cross-encoder, sigmoid of its logit; pairs cut to %d tokens",
                    reranker.max_len)
    return reranker


def _reranker(task: str, tokenizer):
    """With --task rerank, the reranker's prompt pieces and yes/no tokens (RuntimeError when
    the vocabulary cannot answer yes/no in one token); None otherwise."""
    if task != "rerank":
        return None

    try:
        reranker = Reranker.for_tokenizer(tokenizer)
    except ValueError as exc:
        raise RuntimeError(f"--task rerank: {exc}") from None
    logger.info("reranker: P(yes) of token %d against no %d", reranker.yes_id, reranker.no_id)
    return reranker


async def _serve(args, builds, tables, name, embedding, prestarted=None) -> int:
    try:
        store = ResponseStore(args.response_store, args.response_store_max)
    except ValueError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="radixserve-")
    try:
        placement, launchers = await _placement(args, len(builds))
    except RuntimeError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 1
    if launchers is None and prestarted is not None:  # the one local engine, started ahead
        launchers = [LocalLauncher(prestarted)]
    supervisor = ReplicaSet(builds, tmp, args.startup_timeout, _restart_policy(args),
                            routing_config(args), launchers)
    fatal: list[str] = []
    frontend = asyncio.ensure_future(asyncio.to_thread(tables))  # beside the engine's load
    try:
        ready = await supervisor.start()
        startup_trace.mark("engine ready")
        tokenizer, validator = await frontend
        startup_trace.mark("frontend tables")
        tool_format, tool_parser = _tool_parser(args.tool_call_parser, tokenizer)
        reasoning_name, reasoning = _reasoning_parser(args.reasoning_parser, tokenizer)
        reranker = (_cross_encoder(args, ready.max_model_len)
                    or _reranker(args.task, tokenizer))
        client = supervisor.client
        metrics = ServerMetrics(client, name, ready.max_model_len)
        metrics.registry.register(ReplicaCollector(supervisor, name))
        engine = AsyncLLM(client, tokenizer, ready.max_model_len, metrics)
        ctx = ServingContext(engine, name, args.max_n, tool_parser, reasoning,
                             tool_call_grammar=not args.no_tool_call_grammar,
                             next_turn=NextTurnWarmer(not args.no_warm_next_turn),
                             grammar_validator=validator,
                             structured_strict=args.structured_strict == "true",
                             max_prompts_per_request=args.max_prompts_per_request,
                             embedding=embedding, model_path=_model_path(args),
                             response_store=store, reranker=reranker,
                             loras=dict(args.lora),  # --lora NAME=PATH
                             reasoning_budget=budget_policy(args, reasoning),
                             media=media_policy(args),
                             images=(image_processor(_model_path(args), args.mmproj, tokenizer,
                                                     args.image_max_tokens)
                                     if ready.takes_images else None),
                             max_response_bytes=max_response_bytes(args))
        metrics.registry.register(ctx.next_turn.collector(name))
        limits = serve_limits(args)
        hosts = host_policy(args)
        app = build_app(ctx, metrics, args.api_key, limits, hosts, args.lora_updates)
        if warning := startup_warning(hosts):
            print(warning, file=sys.stderr, flush=True)
        edge = limits.connections
        raise_fd_limit((edge.max_connections or 65536) + 1024)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                loop="none", http=guarded_protocol(edge),
                                timeout_keep_alive=edge.keep_alive_timeout,
                                timeout_graceful_shutdown=args.drain_timeout + _DRAIN_GRACE_S)
        server = _Server(config, app.router.drain, args.drain_timeout)

        def on_fatal(reason: str) -> None:  # no engine and none coming: exit non-zero
            fatal.append(reason)
            server.should_exit = True

        supervisor.watch(on_fatal, metrics.engine_restarts.inc)
        _settle_gc()
        replicas = (f", {len(builds)} replicas, {args.dp_routing} routing" if len(builds) > 1
                    else "")
        print(f"radixserve: serving {name} on http://{args.host}:{args.port} "
              f"(context {ready.max_model_len}, {ready.num_kv_blocks} KV blocks{replicas}; "
              f"embeddings: {embedding.pooling + ' pooling' if embedding.pooling else 'off'}; "
              f"reasoning: {reasoning_name or 'none'}; tool calls: {tool_format})",
              file=sys.stderr, flush=True)
        startup_trace.end()
        warm = asyncio.ensure_future(validator.warm_when_quiet(lambda: client.num_in_flight,
                                                             quiet_s=QUIET_S))
        try:
            await server.serve()
        finally:
            warm.cancel()
    except RuntimeError as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        await asyncio.wait([frontend])  # the engine may have failed first: let them finish
        if not frontend.cancelled():
            frontend.exception()  # seen (raised above where it mattered)
        await supervisor.close(timeout=10)
        if placement is not None:
            placement.close()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if fatal:
        print(f"radixserve: error: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


async def _placement(args, num_replicas: int):
    """``(RayPlacement, its launchers)`` with ``--distributed-executor-backend ray``, else
    ``(None, None)``: the replicas are local processes."""
    config = ray_config(args)
    if config is None:
        return None, None
    placement = await RayPlacement.connect(config, num_replicas)
    return placement, [placement.launcher(i) for i in range(num_replicas)]


def _restart_policy(args):
    return RestartPolicy(enabled=not args.no_engine_restart,
                         max_attempts=args.engine_restart_attempts,
                         stall_timeout_s=args.engine_stall_timeout)


def _settle_gc() -> None:
    """Move everything start-up allocated (modules, the tokenizer tables) out of the garbage
    collector's sight, and let the young generation grow to 10,000 objects (CPython: 700): a
    streaming server allocates objects per token, most of them freed by reference counting
    within milliseconds; with the default thresholds a young collection ran every few hundred
    of them and promoted the rest into full collections that walked the whole heap. Measured
    with the mock engine at 64 streams: 15 % of the API process in the collector before, 5 %
    after."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 100)


_DRAIN_GRACE_S = 2.0
"""How long after the drain deadline uvicorn cancels what is still running: the responses
ended by the drain write their last chunks meanwhile."""


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown, which would kill us
    before the engine is stopped; handle them on the loop instead. ``drain`` expires
    ``drain_timeout`` s into the shutdown, or at a second SIGINT (uvicorn's force exit)."""

    def __init__(self, config, drain, drain_timeout: float) -> None:
        super().__init__(config)
        self.drain, self.drain_timeout = drain, drain_timeout

    async def shutdown(self, sockets=None) -> None:
        asyncio.get_running_loop().call_later(self.drain_timeout, self.drain.expire)
        await super().shutdown(sockets)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self.force_exit:
            self.drain.expire()

    @contextlib.contextmanager
    def capture_signals(self):
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)



def _server_class() -> type[_Server]:
    return _Server


# What ``--models-dir`` (frontend/models_dir) shares with the single-model path: each model it
# loads is started and served the same way.
frontend_tables = _frontend_tables
tool_parser = _tool_parser
reasoning_parser = _reasoning_parser
reranker = _reranker
restart_policy = _restart_policy
server_class = _server_class
settle_gc = _settle_gc
DRAIN_GRACE_S = _DRAIN_GRACE_S
