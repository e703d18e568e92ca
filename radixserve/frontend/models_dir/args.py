"""The ``--models-dir`` flags of ``radixserve serve``, and Ollama's ``keep_alive`` values."""

from __future__ import annotations

import argparse
import re

from radixserve.arg_types import non_negative, positive, positive_int

DEFAULT_IDLE_UNLOAD_S = 300.0  # Ollama's default keep_alive: 5 minutes


def add_models_dir_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("many models (--models-dir)")
    g.add_argument("--models-dir", default=None, metavar="DIR",
                   help="serve every model in DIR (*.gguf files and Hugging Face safetensors "
                        "folders), each loaded into its own engine on its first request and "
                        "picked by the request's model field; --model is then ignored")
    g.add_argument("--max-loaded-models", type=positive_int, default=3, metavar="N",
                   help="with --models-dir: models loaded at once; loading one more unloads "
                        "the least recently used idle one (default 3, as Ollama on CPU)")
    g.add_argument("--models-idle-unload", type=non_negative, default=DEFAULT_IDLE_UNLOAD_S,
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


def parse_keep_alive(value) -> float | None:
    """Ollama's ``keep_alive``: seconds as a number, or a Go duration string ("5m", "1h30m",
    "-1s"), or a number in a string. Returns seconds to stay loaded after the request: 0 unload
    now, ``math.inf`` stay (any negative value), None when not given. ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"keep_alive: expected seconds or a duration, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
            parts = _PART.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"keep_alive: cannot read {value!r} as a duration (e.g. "
                                 "\"5m\", \"30s\", \"1h\", 0, -1)") from None
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"keep_alive: expected seconds or a duration, got {value!r}")
    return float("inf") if seconds < 0 else seconds
