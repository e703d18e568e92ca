"""The ``--models-dir`` flags of ``radixserve serve``, and Ollama's ``keep_alive`` values."""

from __future__ import annotations

import argparse
import math
import re

from radixserve.arg_types import positive, positive_int

DEFAULT_IDLE_UNLOAD_S = 300.0  # Ollama's default keep_alive: 5 minutes
# Go's longest time.Duration (2^63 - 1 ns, about 292 years): Ollama refuses a longer one
MAX_KEEP_ALIVE_S = (2**63 - 1) / 1e9


def add_models_dir_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("many models (--models-dir)")
    g.add_argument("--models-dir", default=None, metavar="DIR",
                   help="serve every model in DIR (*.gguf files and Hugging Face safetensors "
                        "folders), each loaded into its own engine on its first request and "
                        "picked by the request's model field; --model is then ignored")
    g.add_argument("--max-loaded-models", type=positive_int, default=3, metavar="N",
                   help="with --models-dir: models loaded at once; loading one more unloads "
                        "the least recently used idle one (default 3, as Ollama on CPU)")
    g.add_argument("--models-idle-unload", type=idle_seconds, default=DEFAULT_IDLE_UNLOAD_S,
                   metavar="SECONDS",
                   help="with --models-dir: unload a model idle this long (default 300, as "
                        "Ollama's keep_alive; 0: never). An Ollama request's keep_alive sets "
                        "it for its model")
    g.add_argument("--models-memory-gb", type=positive, default=None, metavar="GB",
                   help="with --models-dir: memory the loaded models may take together, by "
                        "estimate (weights' file size + KV pool + 0.3 GiB per engine); "
                        "default: whatever the system has available at each load")


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")  # plain decimal: no nan, inf, 1e9


def parse_keep_alive(value) -> float | None:
    """Ollama's ``keep_alive``: seconds as a number, or a Go duration string ("5m", "1h30m",
    "-1s"), or a plain decimal number in a string. Returns seconds to stay loaded after the
    request: 0 unload now, ``math.inf`` stay (any negative value), None when not given.
    ValueError naming the value for anything else: nan, infinities, exponents, and durations
    past Go's longest (`MAX_KEEP_ALIVE_S`, as Ollama refuses them)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        wrong = f"keep_alive: expected seconds or a duration, got {_shown(value)}"
        raise ValueError(wrong)  # noqa: TRY004 - as every bad value: the routes' one 400
    if isinstance(value, str):
        seconds = _duration(value)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an integer past any float
            seconds = math.inf if value > 0 else -math.inf
    if math.isnan(seconds):
        raise ValueError(f"keep_alive: {_shown(value)} is not a number of seconds")
    if seconds < 0:
        return math.inf
    if seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(f"keep_alive: {_shown(value)} is out of range (at most "
                         f"{MAX_KEEP_ALIVE_S:.0f} s, about 292 years; a negative value keeps "
                         "the model loaded)")
    return seconds


def _duration(value: str) -> float:
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return float(text)
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.removeprefix("+"))
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive: cannot read {_shown(value)} as a duration (e.g. "
                         "\"5m\", \"30s\", \"1h\", 0, -1)")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def idle_seconds(text: str) -> float:
    """``--models-idle-unload``: seconds >= 0, finite, at most `MAX_KEEP_ALIVE_S`."""
    try:
        seconds = parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("keep_alive: ")) from None
    if seconds is None or math.isinf(seconds):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return seconds
