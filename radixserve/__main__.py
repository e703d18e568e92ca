"""Command line: ``radixserve serve | generate | chat | pull | ls | rm | bench | env``."""

from __future__ import annotations

import argparse
import functools
import sys
import time

from radixserve.arg_types import DefaultsFormatter
from radixserve.cli_args import add_engine_args, add_sampling_args, engine_kwargs, sampling_params
from radixserve.hub import HubError, is_hub_ref, parse_hub_ref, resolve_model
from radixserve.hub.cli import add_hub_commands, run_hub_command

# `radixserve generate` without a prompt: the first run (scripts/run.sh) shows the model at its
# best: a question in its chat template, sampled as SmolLM2's makers sample it (temperature 0.2,
# top-p 0.9; a GGUF's own general.sampling.* wins), with a repetition penalty against the loops
# greedy decoding falls into (compared on the embedded model: greedy repeats its lines).
DEMO_PROMPT = "Explain in a few sentences why the sky is blue."
DEMO_SAMPLING = {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 256}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prestarted = None
    if argv[:1] == ["serve"]:
        from radixserve import startup_trace
        from radixserve.cluster import engine_prestart
        from radixserve.cpu.threads import limit_api_threads

        startup_trace.begin("api")  # RADIXSERVE_STARTUP_PROFILE: benchmarks/startup_profile.py
        limit_api_threads()  # before the serve flags' modules load numpy (and OpenBLAS)
        prestarted = engine_prestart.prestart(argv)  # the engine starts up beside us
    parser = argparse.ArgumentParser(prog="radixserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=DefaultsFormatter)

    gen = sub.add_parser("generate", help="print a continuation of a prompt (no prompt: a demo)")
    gen.add_argument("prompt", nargs="?", default=None,
                     help="the prompt text. None: a demo question in the chat template, "
                          "sampled as the model recommends (else temperature 0.2, top-p 0.9) "
                          "with repetition penalty 1.1; flags given still win")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_engine_args(gen)
    add_sampling_args(gen, temperature=0.0, max_tokens=64)

    chat = sub.add_parser("chat", help="interactive chat in the terminal, streamed")
    chat.add_argument("--system", default=None, help="system message")
    add_engine_args(chat)
    add_sampling_args(chat, temperature=0.7, max_tokens=512)

    from radixserve.serve_args import add_serve_args  # loads numpy: after the limit above

    add_serve_args(sub.add_parser("serve", help="OpenAI-compatible HTTP server"))
    add_hub_commands(sub)

    env = sub.add_parser("env", help="versions, CPU features, the kernel level and what each "
                                     "layer type of a model computes with")
    env.add_argument("--model", default=None, help="a .gguf file, a Hugging Face folder or "
                                                   "hf.co/OWNER/REPO[:QUANT] (default: the "
                                                   "embedded model)")
    env.add_argument("--quantization", default="auto",
                     choices=["auto", "none", "int8", "gguf", "16bit-stored"])
    env.add_argument("--draft-model", default=None, metavar="PATH",
                     help="a draft model for --speculative draft: its shape and whether its "
                          "vocabulary fits the model's")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    offline = bench_sub.add_parser("offline", help="in-process load, prefill and decode speed")
    from radixserve.bench.offline import add_args as add_offline_args
    add_offline_args(offline)
    add_engine_args(offline)
    from radixserve.bench import plots as bench_plots
    from radixserve.bench import render as bench_render
    from radixserve.bench import serve as bench_serve
    bench_serve.add_args(bench_sub.add_parser(
        "serve", help="load-test an OpenAI-compatible server (TTFT, ITL, throughput)"))
    bench_render.add_args(bench_sub.add_parser(
        "render", help="speed of /v1/chat/completions/render (template + tokenizer)"))
    bench_plots.add_args(bench_sub.add_parser(
        "plot", help="overlay the latency CDFs of bench serve --result-json files"))

    args = parser.parse_args(argv)
    if prestarted is not None:
        prestarted = prestarted.wanted_by(args)
    try:
        if args.command in ("pull", "ls", "rm"):
            return run_hub_command(args)
        _resolve_models(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "chat":
            return _chat(args)
        if args.command == "serve" and args.models_dir is not None:
            from radixserve.serve_models_dir import serve_models_dir

            return serve_models_dir(args)
        if args.command == "serve":
            from radixserve.serve import serve  # the server's modules: only to serve

            return serve(args, prestarted)
        if args.command == "bench":
            return _bench(args)
        if args.command == "env":
            from radixserve.env_report import report
            print(report(args.model, args.quantization, args.draft_model))
            return 0
    except (ValueError, FileNotFoundError, HubError) as exc:
        print(f"radixserve: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _resolve_models(args: argparse.Namespace) -> None:
    """Pull (or find in the cache) the hf.co/ models named by --model and --draft-model, so
    everything after sees local paths. Mutates ``args``; a served model keeps its reference
    as its name. HubError when one cannot be had."""
    offline = getattr(args, "offline", False)
    if getattr(args, "models_dir", None) is not None:
        return  # --model is ignored there; its hf.co/ names are looked up per request
    model = getattr(args, "model", None)
    if is_hub_ref(model) and getattr(args, "served_model_name", "") is None:
        args.served_model_name = parse_hub_ref(model).name
    for attr in ("model", "draft_model"):
        if getattr(args, attr, None) is not None:
            setattr(args, attr, resolve_model(getattr(args, attr), offline))


def _bench(args) -> int:
    if args.bench_command == "serve":
        from radixserve.bench.serve import run
        return run(args)
    if args.bench_command == "render":
        from radixserve.bench.render import run
        return run(args)
    if args.bench_command == "plot":
        from radixserve.bench.plots import run
        return run(args)
    from radixserve.bench.offline import run
    return run(args, engine_kwargs(args))


def _load(args):
    from radixserve.recommended_sampling import recommended_sampling

    # validated before the (slow) model load
    params = sampling_params(args, recommended_sampling(args.model))
    print(f"radixserve: loading {args.model or 'the embedded model'} ...", file=sys.stderr,
          flush=True)
    start = time.perf_counter()
    from radixserve import LLM

    llm = LLM(args.model, **engine_kwargs(args))
    print(f"radixserve: ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return llm, params


def _generate(args) -> int:
    if args.prompt is None:
        args.prompt, args.chat = DEMO_PROMPT, True
        args.sampling_defaults = DEMO_SAMPLING
        print("radixserve: no prompt given, so a demo: a question in the model's chat template,"
              " sampled (--help shows the flags; `generate \"TEXT\"` continues your text)\n"
              f">>> {DEMO_PROMPT}", file=sys.stderr)
    if not args.prompt:
        raise ValueError("the prompt is empty")
    llm, params = _load(args)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    for delta in llm.stream(prompt, params, chat=args.chat):
        print(delta, end="", flush=True)
    print()
    return 0


CHAT_HELP = """commands:
  /help    this list
  /reset   forget the conversation (the system message stays)
  /exit    quit (also /quit, Ctrl-D)
a line starting with / is a command; start it with a space to send it as text"""


def _chat(args) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # not on every platform
        pass
    llm, params = _load(args)
    history = [{"role": "system", "content": args.system}] if args.system else []
    print("radixserve chat — /help lists the commands, /exit or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        command = line.strip() if line.startswith("/") else None
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            history = history[:1] if args.system else []
            print("(conversation cleared)", file=sys.stderr)
            continue
        if command in ("/help", "/?"):
            print(CHAT_HELP, file=sys.stderr)
            continue
        if command is not None:
            print(f"unknown command {command.split()[0]!r}; /help lists them", file=sys.stderr)
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line.strip()})
        reply = []
        try:
            for delta in llm.stream(history, params, chat=True):
                reply.append(delta)
                print(delta, end="", flush=True)
        except KeyboardInterrupt:
            pass
        except ValueError as exc:  # e.g. the conversation outgrew the context window
            print(f"\nradixserve: error: {exc}", file=sys.stderr)
            history.pop()
            continue
        print()
        history.append({"role": "assistant", "content": "".join(reply)})


if __name__ == "__main__":
    sys.exit(main())
