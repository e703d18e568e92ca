"""The flags of ``radixserve serve`` (`serve.py` is its wiring). Importing this module loads
the frontend's parser registry and limits, not the server (uvicorn, the app): the CLI builds
every sub-command's parser on each run."""

from __future__ import annotations

import argparse
import os

from radixserve.arg_types import non_negative, non_negative_int, port, positive, positive_int
from radixserve.cli_args import add_engine_args
from radixserve.cluster.dp_args import add_dp_args
from radixserve.frontend.http.host_check import allowed_hosts_arg
from radixserve.frontend.http.limits import add_limit_args
from radixserve.frontend.media.policy import add_media_args
from radixserve.frontend.models_dir.args import add_models_dir_args
from radixserve.frontend.openai.response_size import DEFAULT_MAX_RESPONSE_MB, MB
from radixserve.frontend.parsers import REASONING_PARSERS, TOOL_PARSERS
from radixserve.frontend.parsers.detect import AUTO
from radixserve.frontend.reasoning_budget import add_reasoning_budget_args


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``radixserve serve`` (its engine, data-parallel, limit and --models-dir
    flags included) on ``parser``."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port, default=8000, help="TCP port, 1-65535")
    parser.add_argument("--api-key", default=os.environ.get("RADIXSERVE_API_KEY"),
                        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every "
                             "route but /health, /version, /metrics and the pages "
                             "(env RADIXSERVE_API_KEY)")
    parser.add_argument("--allowed-hosts", type=allowed_hosts_arg, action="append",
                        metavar="NAMES",
                        help="Host header names answered besides IP addresses, names without "
                             "a dot (localhost), *.localhost/.local/.internal, this machine's "
                             "name and --host (comma-separated, repeatable; *.DOMAIN: every name "
                             "under it; '*': any). Others get 403: a DNS-rebinding web page "
                             "sends its own name. Bound to a non-loopback --host with --api-key, "
                             "any name is answered")
    parser.add_argument("--enable-lora-runtime-updates", action="store_true",
                        help="mount vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter "
                             "(off: 404); needs --lora-adapters-dir")
    parser.add_argument("--lora-adapters-dir", default=None, metavar="DIR",
                        help="the only folder run-time LoRA loads read: lora_path is taken "
                             "relative to it, and one whose real path leaves it is refused")
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
    parser.add_argument("--tool-call-parser", default=AUTO, choices=[AUTO, *TOOL_PARSERS],
                        help="the tool-call format read from the output when a request has "
                             "tools. auto (default): the one the model's chat template writes "
                             "calls in (<tool_call>: hermes, qwen3_coder (with <function=) or "
                             "glm45 (with <arg_key>), [TOOL_CALLS]: mistral, "
                             "<|tool_call_start|>: lfm2, <TOOLCALL>: nemotron_v2, "
                             "<|python_tag|>/\"parameters\": llama3_json, functools[: "
                             "phi4_mini, tool▁calls▁begin: deepseek_v3, [func_name(: "
                             "pythonic); hermes for a template without tool support, which "
                             "gets the tools in that format (tokenizer/tool_prompt.py). A name "
                             "overrides the detection (glm47: glm45's, as vLLM names it)")
    parser.add_argument("--no-tool-call-grammar", action="store_true",
                        help="leave tool_choice auto answers free; by default, in the hermes "
                             "format, they are text or text then well-formed calls of the "
                             "request's tools (frontend/parsers/tool_grammar.py)")
    parser.add_argument("--no-warm-next-turn", action="store_true",
                        help="do not prefill the next chat turn's prefix after an answer with "
                             "reasoning whose template drops it from the history (Qwen3, "
                             "DeepSeek-R1, QwQ): by default that prefix is prefilled at the "
                             "lowest priority so the next turn finds it cached "
                             "(frontend/next_turn.py)")
    parser.add_argument("--reasoning-parser", default=None,
                        choices=[AUTO, *REASONING_PARSERS],
                        help="split the reasoning out of the output into reasoning_content "
                             "(off by default). auto: the one the chat template shows "
                             "([THINK]: mistral, <think>: think; none without either); or "
                             "think, qwen3, glm45 (<think>...</think>), deepseek_r1 (starts "
                             "in reasoning), mistral ([THINK]...[/THINK]). Each request's "
                             "rendered prompt decides whether its output starts inside the "
                             "block: a template that opened it (enable_thinking on) or "
                             "closed it (off)")
    add_reasoning_budget_args(parser)
    add_media_args(parser)
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
    parser.add_argument("--max-response-mb", type=non_negative_int,
                        default=DEFAULT_MAX_RESPONSE_MB,
                        metavar="MB",
                        help="largest estimated whole answer of a generation request (MiB): "
                             "n x tokens x (logprobs + 1) x bytes per entry, prompt tokens "
                             "included with echo / prompt_logprobs; beyond, 400 naming the "
                             "factors (0: no limit)")
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
    add_dp_args(parser)
    add_limit_args(parser)
    add_models_dir_args(parser)


def max_response_bytes(args: argparse.Namespace) -> int | None:
    """--max-response-mb in bytes (None: no limit)."""
    return args.max_response_mb * MB or None
