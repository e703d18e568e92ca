"""Rope frequency variants: what ``rope_scaling`` / ``rope_parameters`` of a config asks for.

Each variant computes the inverse frequencies and the attention factor (a scale on cos and
sin) as transformers' ``ROPE_INIT_FUNCTIONS`` do (``modeling_rope_utils.py``):

* ``default``; ``linear`` (frequencies / factor); ``llama3`` (Llama 3.1 band blend);
* ``yarn``: interpolated low frequencies, extrapolated high ones, a linear ramp between
  (``beta_fast``, ``beta_slow``, ``truncate``), attention factor ``0.1 ln(factor) + 1`` (or
  ``attention_factor``, or the ``mscale`` / ``mscale_all_dim`` ratio);
* ``longrope`` (Phi-3): per-frequency ``short_factor`` / ``long_factor`` divisors, attention
  factor ``sqrt(1 + ln(s) / ln(original))`` with ``s`` = ``factor`` or window / original;
* ``dynamic`` (dynamic NTK): the base raised for the sequence length;
* ``freq_factors``: GGUF's ``rope_freqs.weight`` divisors (llama3 as llama.cpp stores it).

NOTE: a paged KV cache keeps every key as it was rotated when it was written, so a position's
rotation may never change with the length a sequence reaches. transformers re-picks two
variants by length: dynamic NTK recomputes the base for the current length, longrope uses the
long factors once the sequence passes ``original_max_position_embeddings``. Here both are fixed
once by the engine's context length ``context_len`` (its ``max_model_len``): the frequencies are
the ones transformers uses for a sequence of that full length. So dynamic NTK is plain rope
(exactly transformers) while the context fits ``max_position_embeddings``, and beyond it the
base transformers computes at ``context_len``; longrope takes the short factors while the
context fits the original length (exactly transformers for every sequence), else the long ones
(exactly transformers for every sequence longer than the original length). vLLM fixes dynamic
NTK at ``factor`` times the window instead, which never equals transformers on short inputs.
"""

from __future__ import annotations

import math

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
_GGUF_ROPE_TYPES = ("freq_factors",)  # made by the GGUF loader only
_NEEDS_ORIGINAL = ("llama3", "yarn", "longrope")  # transformers' standardize_rope_params


def rope_type(scaling: dict | None) -> str:
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def normalize_rope_scaling(scaling: dict | None, max_positions: int,
                           original_max_positions: int | None = None,
                           aliases: dict[str, str] | None = None) -> dict | None:
    """A config's rope dict as the variants read it: ``rope_type`` set (from ``type`` too,
    then renamed by ``aliases``, e.g. Phi-3's ``su`` → ``longrope``) and, for llama3 / yarn /
    longrope, ``original_max_position_embeddings`` filled: a top-level value first (Phi-3
    keeps it there), else the dict's own, else ``max_positions``. None for default rope.
    ValueError naming the supported types for an unknown one."""
    kind = rope_type(scaling)
    kind = (aliases or {}).get(kind, kind)
    if kind not in SUPPORTED_ROPE_TYPES + _GGUF_ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling type {kind!r}; supported: "
                         f"{list(SUPPORTED_ROPE_TYPES)}")
    if kind == "default":
        return None
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta")}
    out["rope_type"] = kind
    if kind in _NEEDS_ORIGINAL:
        out["original_max_position_embeddings"] = (
            original_max_positions or out.get("original_max_position_embeddings")
            or max_positions)
    return out


def rope_window(max_positions: int, scaling: dict | None) -> int:
    """The context the scaled rope is made for (vLLM's rule): ``linear`` and ``dynamic``
    stretch ``max_positions`` by ``factor``, ``yarn`` the original length by ``factor``; the
    other variants (llama3, longrope) already say the scaled length in ``max_positions``."""
    kind = rope_type(scaling)
    if kind in ("linear", "dynamic"):
        return int(max_positions * scaling["factor"])
    if kind == "yarn" and scaling.get("factor"):
        return max(max_positions,
                   int(scaling["original_max_position_embeddings"] * scaling["factor"]))
    return max_positions


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict | None, max_positions: int,
                     context_len: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] float64, attention factor) for an engine whose
    sequences reach ``context_len`` tokens (see the NOTE above)."""
    kind = rope_type(scaling)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    inv_freq = 1.0 / theta ** exponents
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if kind == "freq_factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64), 1.0
    if kind == "dynamic":
        factor, seq_len = scaling["factor"], max(context_len, max_positions)
        base = theta * ((factor * seq_len / max_positions) - (factor - 1)) ** (
            rotary_dim / (rotary_dim - 2))
        return 1.0 / base ** exponents, 1.0
    if kind == "yarn":
        return _yarn(rotary_dim, theta, scaling, max_positions)
    if kind == "longrope":
        return _longrope(inv_freq, scaling, max_positions, context_len)
    raise ValueError(f"unsupported rope scaling type {kind!r}; supported: "
                     f"{list(SUPPORTED_ROPE_TYPES)}")


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend in between."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, theta: float, s: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN: dimensions turning fewer than ``beta_slow`` times over the original length are
    interpolated (/ factor), more than ``beta_fast`` times kept, a linear ramp between."""
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_positions / original
    attention = s.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
        attention = (_mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
                     if mscale and mscale_all_dim else _mscale(factor))
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:  # the dim turning that many times
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    # ramp 0: keep the frequency (extrapolate), 1: divide it by factor (interpolate)
    return extrapolated / factor * ramp + extrapolated * (1 - ramp), float(attention)


def _longrope(inv_freq: torch.Tensor, s: dict, max_positions: int,
              context_len: int) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_positions / original
    attention = s.get("attention_factor")
    if attention is None:
        attention = (1.0 if factor <= 1.0
                     else math.sqrt(1 + math.log(factor) / math.log(original)))
    factors = s["long_factor"] if context_len > original else s["short_factor"]
    if len(factors) != len(inv_freq):
        raise ValueError(f"longrope factors have {len(factors)} values; the rotary dimension "
                         f"needs {len(inv_freq)}")
    return inv_freq / torch.tensor(factors, dtype=torch.float64), float(attention)
