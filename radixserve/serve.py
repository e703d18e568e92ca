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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile

from radixserve.arg_types import non_negative, port, positive, positive_int
from radixserve.cli_args import add_engine_args, engine_kwargs

logger = logging.getLogger(__name__)


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port, default=8000, help="TCP port, 1-65535")
    parser.add_argument("--api-key", default=os.environ.get("RADIXSERVE_API_KEY"),
                        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                             "(env RADIXSERVE_API_KEY)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients use (default: the model file's name)")
    parser.add_argument("--mock-engine", action="store_true",
                        help="no model: instant prefill, one random token per step "
                             "(frontend benchmarks)")
    parser.add_argument("--mock-step-ms", type=non_negative, default=0.0,
                        help="with --mock-engine: at most one step per this many ms, standing "
                             "in for a model's decode step (default: back to back)")
    parser.add_argument("--mock-max-seqs", type=int, default=1024,
                        help="with --mock-engine: requests running at once (others wait)")
    from radixserve.frontend.parsers import TOOL_PARSERS
    from radixserve.frontend.parsers.detect import AUTO

    parser.add_argument("--tool-call-parser", default=AUTO, choices=[AUTO, *TOOL_PARSERS],
                        help="the tool-call format read from the output when a request has "
                             "tools. auto (default): the one the model's chat template writes "
                             "calls in (<tool_call>: hermes or qwen3_coder, [TOOL_CALLS]: "
                             "mistral, <|python_tag|>/\"parameters\": llama3_json, "
                             "functools[: phi4_mini, tool▁calls▁begin: deepseek_v3, "
                             "[func_name(: pythonic); hermes for a template without tool "
                             "support, which gets the tools in that format "
                             "(tokenizer/tool_prompt.py). A name overrides the detection")
    parser.add_argument("--no-tool-call-grammar", action="store_true",
                        help="leave tool_choice auto answers free; by default, in the hermes "
                             "format, they are text or text then well-formed calls of the "
                             "request's tools (frontend/parsers/tool_grammar.py)")
    parser.add_argument("--reasoning-parser", default=None,
                        help="split <think> reasoning into reasoning_content "
                             "(think, qwen3, deepseek_r1)")
    parser.add_argument("--max-n", type=positive_int, default=16, help="largest accepted n")
    parser.add_argument("--task", default="auto", choices=["auto", "embed", "rerank"],
                        help="embed: serve /v1/embeddings (pooled final hidden states) even "
                             "for a model whose files name no pooling (auto: embedding "
                             "models only). rerank: serve /v1/rerank and /v1/score with a "
                             "causal-LM reranker, scored as Qwen3-Reranker (P(yes) of a "
                             "yes/no judgement prompt: frontend/rerank.py), or a BERT / XLM-R "
                             "cross-encoder folder's sigmoid(logit) (frontend/cross_encoder.py;"
                             " auto picks rerank for those)")
    parser.add_argument("--pooling", default=None, choices=["last", "mean"],
                        help="how embeddings pool the tokens' hidden states (default: the "
                             "model's pooling_type, else last)")
    parser.add_argument("--structured-strict", default="true", choices=["true", "false"],
                        help="what a JSON schema without 'strict' gets: true closes its objects "
                             "(additionalProperties false where unspecified) and fixes its "
                             "whitespace; false takes it as written. 'strict' in a request wins")
    parser.add_argument("--max-prompts-per-request", type=int, default=128,
                        help="most prompts one /v1/completions request may list (each is an "
                             "engine request of its own, times n)")
    parser.add_argument("--response-store", default=None, metavar="PATH",
                        help="SQLite file keeping /v1/responses responses across restarts "
                             "(default: in memory)")
    parser.add_argument("--response-store-max", type=positive_int, default=10_000,
                        metavar="N", help="responses kept; the oldest are evicted first")
    parser.add_argument("--drain-timeout", type=non_negative, default=30.0,
                        help="seconds to finish in-flight requests on shutdown")
    parser.add_argument("--startup-timeout", type=positive, default=600.0,
                        help="seconds the engine may take to load before the server gives up")
    parser.add_argument("--no-engine-restart", action="store_true",
                        help="if the engine process dies, exit non-zero (for an outside "
                             "supervisor) instead of starting a new one")
    parser.add_argument("--engine-restart-attempts", type=positive_int, default=5,
                        help="consecutive failed engine restarts (with back-off) before the "
                             "server gives up and exits non-zero")
    parser.add_argument("--engine-stall-timeout", type=non_negative, default=30.0,
                        metavar="SECONDS",
                        help="an engine silent this long with requests in flight (or 4x its "
                             "longest step of the last 10 minutes, if more) is hung: /health "
                             "503, its requests fail, it is killed and restarted (0: off)")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="the HTTP server's log level")
    add_engine_args(parser)
    from radixserve.cluster.dp_args import add_dp_args
    from radixserve.frontend.http.limits import add_limit_args

    add_dp_args(parser)
    add_limit_args(parser)
    from radixserve.frontend.models_dir.args import add_models_dir_args

    add_models_dir_args(parser)


def serve(args: argparse.Namespace) -> int:
    from radixserve.cpu.threads import limit_api_threads

    limit_api_threads()  # before the tokenizer's imports load numpy (and OpenBLAS)
    if args.distributed_executor_backend == "ray":
        from radixserve.cluster.ray_executor import require_ray

        require_ray()  # at once, not after the tokenizer has loaded
    from radixserve.frontend.parsers import get_reasoning_parser
    from radixserve.tokenizer.tokenizer import load_tokenizer
    from radixserve.models.source import ModelSource

    source = ModelSource.resolve(args.model)
    args.task = _task(source, args.task)
    reasoning = get_reasoning_parser(args.reasoning_parser) if args.reasoning_parser else None
    embedding = _embedding_setup(source, args)
    kwargs = engine_kwargs(args)
    tables = functools.partial(_frontend_tables, load_tokenizer, source)
    if args.mock_engine:
        from radixserve.bench.mock_engine import MockEngine

        tokenizer, validator = loaded = tables()  # the mock needs the vocabulary size
        tables = functools.partial(tuple, loaded)

        def make_build(threads):
            return functools.partial(MockEngine, tokenizer.vocab_size,
                                     args.max_model_len or 8192, args.mock_max_seqs,
                                     step_time=args.mock_step_ms / 1000)
    else:
        from radixserve.engine.core_proc import build_engine

        def make_build(threads):  # built in the engine process (core_proc.py)
            return functools.partial(build_engine, {**kwargs, "threads": threads}, args.model)
    from radixserve.cluster.dp_args import ray_config, replica_builds

    builds = replica_builds(args.data_parallel_size, make_build, args.threads,
                            ray_config(args))
    if len(builds) > 1:  # each replica's KV events on its own port
        from radixserve.engine.kv_events import with_replica_rank

        builds = [functools.partial(with_replica_rank, r, b) for r, b in enumerate(builds)]
    name = args.served_model_name or source.name
    import uvloop

    return uvloop.run(_serve(args, builds, tables, name, reasoning, embedding))


def _frontend_tables(load_tokenizer, source):
    """What the API process derives from the model before it serves: the tokenizer with its
    token -> bytes table and the grammar validator (seconds on a 262k vocabulary; built while
    the engine process loads the model)."""
    from radixserve.models.cross_encoder_config import cross_encoder_config
    from radixserve.structured.validator import GrammarValidator, grammar_validator

    tokenizer = load_tokenizer(source)
    tokenizer.detokenizer([])  # builds the token → bytes table now, not on the first request
    if cross_encoder_config(source) is not None:  # it scores pairs: no grammar over its vocab
        return tokenizer, GrammarValidator()
    return tokenizer, grammar_validator(tokenizer)


def _tool_parser(requested: str, tokenizer):
    """(name, parser) of the tool-call format: `requested`, or with "auto" the one the
    tokenizer's chat template writes (`detect.resolve_tool_format`); logged once. Mutates the
    tokenizer: the format's markers that are special tokens decode as text from now on."""
    from radixserve.frontend.parsers import get_tool_parser
    from radixserve.frontend.parsers.detect import resolve_tool_format

    name, why = resolve_tool_format(requested, tokenizer.chat_template)
    logger.info("tool-call format: %s (%s)", name, why)
    parser = get_tool_parser(name)
    kept = tokenizer.decode_as_text(parser.format.markers)
    if kept:
        logger.info("special tokens decoded as text for the tool-call parser: %s",
                    " ".join(kept))
    return name, parser


def _model_path(args) -> str | None:
    from radixserve.models.source import ModelSource

    return ModelSource.resolve(args.model).path


def _embedding_setup(source, args):
    from radixserve.frontend.pooling import resolve_embedding

    try:
        return resolve_embedding(source, args.pooling, args.task)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None


def _task(source, task: str) -> str:
    """``--task``, with auto resolved to rerank for a cross-encoder folder."""
    from radixserve.frontend.cross_encoder import resolve_task

    try:
        return resolve_task(source, task)
    except ValueError as exc:
        raise SystemExit(f"radixserve: error: {exc}") from None


def _cross_encoder(args, max_model_len: int):
    """With --task rerank on a cross-encoder folder, its pair tokenizer; None otherwise."""
    if args.task != "rerank" or args.mock_engine:
        return None
    from radixserve.frontend.cross_encoder import cross_encoder_reranker

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
    from radixserve.frontend.rerank import Reranker

    try:
        reranker = Reranker.for_tokenizer(tokenizer)
    except ValueError as exc:
        raise RuntimeError(f"--task rerank: {exc}") from None
    logger.info("reranker: P(yes) of token %d against no %d", reranker.yes_id, reranker.no_id)
    return reranker


async def _serve(args, builds, tables, name, reasoning, embedding) -> int:
    import uvicorn

    _Server = _server_class()
    from radixserve.cluster.dp_args import routing_config
    from radixserve.cluster.dp_metrics import ReplicaCollector
    from radixserve.cluster.replica_set import ReplicaSet
    from radixserve.frontend.async_llm import AsyncLLM
    from radixserve.frontend.app import build_app
    from radixserve.frontend.http.metrics import ServerMetrics
    from radixserve.frontend.http.connection_guard import guarded_protocol, raise_fd_limit
    from radixserve.frontend.http.limits import serve_limits
    from radixserve.frontend.responses.store import ResponseStore
    from radixserve.frontend.openai.serving import ServingContext
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
    supervisor = ReplicaSet(builds, tmp, args.startup_timeout, _restart_policy(args),
                            routing_config(args), launchers)
    fatal: list[str] = []
    frontend = asyncio.ensure_future(asyncio.to_thread(tables))  # beside the engine's load
    try:
        ready = await supervisor.start()
        tokenizer, validator = await frontend
        tool_format, tool_parser = _tool_parser(args.tool_call_parser, tokenizer)
        reranker = (_cross_encoder(args, ready.max_model_len)
                    or _reranker(args.task, tokenizer))
        client = supervisor.client
        metrics = ServerMetrics(client, name, ready.max_model_len)
        metrics.registry.register(ReplicaCollector(supervisor, name))
        engine = AsyncLLM(client, tokenizer, ready.max_model_len, metrics)
        ctx = ServingContext(engine, name, args.max_n, tool_parser, reasoning,
                             tool_call_grammar=not args.no_tool_call_grammar,
                             grammar_validator=validator,
                             structured_strict=args.structured_strict == "true",
                             max_prompts_per_request=args.max_prompts_per_request,
                             embedding=embedding, model_path=_model_path(args),
                             response_store=store, reranker=reranker,
                             loras=dict(args.lora))  # --lora NAME=PATH
        limits = serve_limits(args)
        app = build_app(ctx, metrics, args.api_key, limits)
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
              f"tool calls: {tool_format})",
              file=sys.stderr, flush=True)
        await server.serve()
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
    from radixserve.cluster.dp_args import ray_config

    config = ray_config(args)
    if config is None:
        return None, None
    from radixserve.cluster.ray_executor import RayPlacement

    placement = await RayPlacement.connect(config, num_replicas)
    return placement, [placement.launcher(i) for i in range(num_replicas)]


def _restart_policy(args):
    from radixserve.cluster.engine_supervisor import RestartPolicy

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


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
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

    return Server


# What ``--models-dir`` (frontend/models_dir) shares with the single-model path: each model it
# loads is started and served the same way.
frontend_tables = _frontend_tables
tool_parser = _tool_parser
reranker = _reranker
restart_policy = _restart_policy
server_class = _server_class
settle_gc = _settle_gc
DRAIN_GRACE_S = _DRAIN_GRACE_S


def reasoning(args: argparse.Namespace):
    """The ``--reasoning-parser`` (None: none)."""
    from radixserve.frontend.parsers import get_reasoning_parser

    return get_reasoning_parser(args.reasoning_parser) if args.reasoning_parser else None
