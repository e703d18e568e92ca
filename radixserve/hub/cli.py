"""``radixserve pull | ls | rm``: models from the Hugging Face hub, in its cache."""

from __future__ import annotations

import argparse
import sys
import time

from radixserve.hub.errors import HubError
from radixserve.hub.ref import parse_hub_ref

REF_HELP = ("[hf.co/]OWNER/REPO[:QUANT], e.g. hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M. "
            "QUANT: a label in the file names (Q4_K_M, Q8_0, IQ4_XS, BF16 ..., any case) or a "
            "file name; none: the repo's only GGUF, else its Q4_K_M")


def add_hub_commands(sub) -> None:
    """The ``pull``, ``ls`` and ``rm`` sub-commands on ``sub`` (argparse sub-parsers)."""
    pull = sub.add_parser(
        "pull", help="download a GGUF model from the Hugging Face hub",
        description="Download a GGUF model into huggingface_hub's cache (HF_HOME; resumable, "
                    "sha256-checked; a split model is joined into one file), for --model "
                    "hf.co/OWNER/REPO[:QUANT] to use. HF_ENDPOINT picks the hub, HF_TOKEN "
                    "gives access to private and gated repos.")
    pull.add_argument("ref", metavar="MODEL", help=REF_HELP)
    sub.add_parser("ls", help="list the models pulled from the hub")
    rm = sub.add_parser("rm", help="remove models pulled from the hub")
    rm.add_argument("refs", nargs="+", metavar="MODEL",
                    help="hf.co/OWNER/REPO[:QUANT] as `ls` lists it (no QUANT: every model "
                         "of the repo)")


def run_hub_command(args: argparse.Namespace) -> int:
    """Run ``pull``/``ls``/``rm``; HubError for the CLI to report."""
    from radixserve.hub.cache import pulled_models, remove_pulled

    if args.command == "pull":
        from radixserve.hub.pull import pull

        model = pull(parse_hub_ref(args.ref, bare=True))
        print(f"radixserve: pulled {model.name} ({_size(model.size_bytes)})", file=sys.stderr)
        print(model.path)
        return 0
    if args.command == "ls":
        rows = [(m.name, _size(m.size_bytes), _when(m.modified)) for m in pulled_models()]
        width = max([len("NAME")] + [len(r[0]) for r in rows])
        print(f"{'NAME':<{width}}  {'SIZE':>9}  MODIFIED")
        for name, size, when in rows:
            print(f"{name:<{width}}  {size:>9}  {when}")
        return 0
    refs = [parse_hub_ref(text, bare=True) for text in args.refs]  # all checked first
    missing = []
    for ref in refs:
        removed = remove_pulled(ref)
        for name in removed:
            print(f"deleted '{name}'")
        if not removed:
            missing.append(ref.name)
    if missing:
        raise HubError(f"not pulled: {', '.join(missing)} (`radixserve ls` lists the models)")
    return 0


def _size(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KB", "MB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
