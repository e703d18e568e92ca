"""LoRA adapter files checked against a base model without reading a weight. Torch-free: the API
process runs it before the engine ever sees an adapter (``/v1/load_lora_adapter``, ``--lora``),
and the engine's loader (models/lora.py) runs the same checks before it reads the weights, so
a malformed adapter is one refused load, never a dead engine.

A PEFT folder: ``adapter_config.json`` is a JSON object whose ``r`` is a positive integer and
``lora_alpha`` a number, with no option we do not apply; ``adapter_model.safetensors`` has a
header the safetensors library accepts (a random or truncated file fails there, before any
tensor is read) naming only ``…layers.N.<module>.<proj>.lora_A`` / ``.lora_B`` matrices, each
floating-point and 2-D, A [r, in] and B [out, r] with the base's sizes and the config's rank,
each A with its B. A GGUF LoRA file (``blk.N.<tensor>.weight.lora_a`` / ``.lora_b``): the
same shapes, one rank throughout, and an adapter of the base's architecture.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass

from radixserve.model_config import ModelConfig
from radixserve.models.registry import GGUF_ARCHITECTURES

# the checkpoint's projection → (the model's fused linear, its part index)
TARGETS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "o_proj": ("o_proj", 0), "gate_proj": ("gate_up_proj", 0),
           "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", 0)}
GGUF_TARGETS = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj",
                "attn_output": "o_proj", "ffn_gate": "gate_proj", "ffn_up": "up_proj",
                "ffn_down": "down_proj"}
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names
_MAX_CONFIG_BYTES = 1 << 20  # a PEFT config is a few kB; more is not one
_MAX_LAYER_DIGITS = 6


class LoraFormatError(ValueError):
    """An adapter that does not fit the base model, or is not an adapter at all (HTTP 400)."""


@dataclass(frozen=True)
class PeftOptions:
    """What ``adapter_config.json`` says that the weights do not: ``scale`` multiplies B A."""

    rank: int
    alpha: float
    use_rslora: bool = False

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def part_sizes(cfg: ModelConfig, linear: str) -> tuple[tuple[int, ...], int]:
    """(the output sizes of ``linear``'s parts, its input size)."""
    return {"qkv_proj": ((cfg.q_size, cfg.kv_size, cfg.kv_size), cfg.hidden_size),
            "o_proj": ((cfg.hidden_size,), cfg.q_size),
            "gate_up_proj": ((cfg.intermediate_size,) * 2, cfg.hidden_size),
            "down_proj": ((cfg.hidden_size,), cfg.intermediate_size)}[linear]


def check_lora_adapter(path: str, cfg: ModelConfig) -> None:
    """Raise unless the adapter at ``path`` (a PEFT folder or a ``.gguf`` file) fits a base of
    shape ``cfg``: FileNotFoundError when there is none, `LoraFormatError` naming the problem.
    Reads the config and the tensors' names, types and shapes only."""
    if cfg.architecture not in SUPPORTED_ARCHITECTURES:
        raise LoraFormatError(f"LoRA adapters are not supported for {cfg.architecture}; "
                              f"supported: {list(SUPPORTED_ARCHITECTURES)}")
    if os.path.isdir(path):
        shapes = _peft_shapes(path)
        rank = read_peft_config(path).rank
    elif os.path.isfile(path) and path.endswith(".gguf"):
        shapes = _gguf_shapes(path, cfg)
        rank = None
    else:
        raise FileNotFoundError(f"no LoRA adapter at {path!r} (a PEFT folder with "
                                f"{PEFT_CONFIG}, or a .gguf LoRA file)")
    _check_shapes(path, cfg, shapes, rank)


def read_peft_config(path: str) -> PeftOptions:
    """``path``/adapter_config.json's rank and scale; `LoraFormatError` for anything else in
    it that we cannot apply or that is not what PEFT writes."""
    file = os.path.join(path, PEFT_CONFIG)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} is missing (a PEFT LoRA folder holds {PEFT_CONFIG} "
                                f"and {PEFT_WEIGHTS})")
    if os.path.getsize(file) > _MAX_CONFIG_BYTES:
        raise LoraFormatError(f"{file}: over {_MAX_CONFIG_BYTES} bytes, not a PEFT config")
    try:
        with open(file, "rb") as f:
            conf = json.loads(f.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraFormatError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(conf, dict):
        raise LoraFormatError(f"{file} must hold a JSON object, not a {type(conf).__name__}")
    if conf.get("peft_type", "LORA") != "LORA":
        raise LoraFormatError(f"{file}: peft_type {conf.get('peft_type')!r} is not LORA")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if conf.get(key):
            raise LoraFormatError(f"{file}: {key} is not supported")
    if conf.get("bias", "none") != "none":
        raise LoraFormatError(f"{file}: LoRA biases (bias={conf['bias']!r}) are not supported")
    if "r" not in conf:
        raise LoraFormatError(f"{file} has no 'r' (the adapter's rank)")
    rank = conf["r"]
    if type(rank) is not int or rank < 1:
        raise LoraFormatError(f"{file}: 'r' must be a positive integer, got {rank!r}")
    alpha = conf.get("lora_alpha", rank)
    if type(alpha) not in (int, float) or not math.isfinite(alpha):
        raise LoraFormatError(f"{file}: 'lora_alpha' must be a number, got {alpha!r}")
    return PeftOptions(rank, float(alpha), bool(conf.get("use_rslora")))


def peft_key(name: str) -> tuple[int, str, str]:
    """(layer, projection, "A" or "B") of a PEFT tensor name
    (``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight``)."""
    for which in ("A", "B"):
        if f".lora_{which}." in name:
            module = name.split(f".lora_{which}.")[0].split(".")
            break
    else:
        raise LoraFormatError(f"unexpected tensor {name!r} (a LoRA adapter holds lora_A and "
                              "lora_B matrices only)")
    if module[-1] not in TARGETS:
        raise LoraFormatError(f"LoRA on {'.'.join(module)!r} is not supported; supported "
                              f"targets: {sorted(TARGETS)}")
    at = module.index("layers") if "layers" in module else len(module)
    return _layer(name, module[at + 1] if at + 2 < len(module) else ""), module[-1], which


def gguf_key(name: str) -> tuple[int, str, str]:
    """(layer, projection, "a" or "b") of a GGUF LoRA tensor name
    (``blk.3.attn_q.weight.lora_a``)."""
    pieces = name.split(".")
    if (len(pieces) != 5 or pieces[0] != "blk" or pieces[2] not in GGUF_TARGETS
            or pieces[3] != "weight" or pieces[4] not in ("lora_a", "lora_b")):
        raise LoraFormatError(f"LoRA on {name!r} is not supported: a GGUF LoRA tensor is "
                              f"blk.N.<tensor>.weight.lora_a / .lora_b, <tensor> one of "
                              f"{sorted(GGUF_TARGETS)}")
    return _layer(name, pieces[1]), GGUF_TARGETS[pieces[2]], pieces[4][-1]


def _layer(name: str, text: str) -> int:
    if not (text.isascii() and text.isdecimal()):
        raise LoraFormatError(f"tensor {name!r} has no layer index (…layers.N… / blk.N…)")
    if len(text) > _MAX_LAYER_DIGITS:
        raise LoraFormatError(f"tensor {name!r}: layer {text[:12]}… does not exist")
    return int(text)


# A tensor's (dtype name, shape) by name, read from the file's header only.
Shapes = dict[str, tuple[str, tuple[int, ...]]]


def _peft_shapes(path: str) -> Shapes:
    from safetensors import SafetensorError, safe_open

    file = os.path.join(path, PEFT_WEIGHTS)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} is missing (a PEFT LoRA folder holds {PEFT_CONFIG} "
                                f"and {PEFT_WEIGHTS})")
    try:
        with safe_open(file, framework="numpy") as f:
            return {name: (s.get_dtype(), tuple(s.get_shape()))
                    for name in f.keys() for s in (f.get_slice(name),)}
    except SafetensorError as exc:
        raise LoraFormatError(f"{file}: not a safetensors file ({exc})") from None


def _gguf_shapes(path: str, cfg: ModelConfig) -> Shapes:
    from radixserve.gguf_reader import open_gguf

    try:
        reader = open_gguf(path)
    except ValueError as exc:
        raise LoraFormatError(f"{path}: not a GGUF file ({exc.__cause__ or exc})") from None

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    if field("general.type") != "adapter" or field("adapter.type") != "lora":
        raise LoraFormatError(f"{path} is not a GGUF LoRA adapter (general.type "
                              f"{field('general.type')!r}, adapter.type "
                              f"{field('adapter.type')!r})")
    arch = field("general.architecture")
    if GGUF_ARCHITECTURES.get(arch) != cfg.architecture:
        raise LoraFormatError(f"{path} is an adapter for a {arch!r} model; the base model is "
                              f"{cfg.architecture}")
    # GGUF lists dimensions innermost first; A [r, in] is stored as (in, r)
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))
            for t in reader.tensors}


def _check_shapes(path: str, cfg: ModelConfig, shapes: Shapes, rank: int | None) -> None:
    """Every tensor a lora A or B of a supported projection in an existing layer, paired, 2-D,
    floating-point (PEFT; GGUF types are the loader's), of the base's sizes, one rank."""
    is_gguf = path.endswith(".gguf")
    key, a_tag, b_tag = (gguf_key, "a", "b") if is_gguf else (peft_key, "A", "B")
    num_pairs = 0
    for name, (dtype, a_shape) in shapes.items():
        try:
            layer, proj, which = key(name)
        except LoraFormatError as exc:
            raise LoraFormatError(f"{path}: {exc}") from None
        if which != a_tag:
            if name.replace(f"lora_{b_tag}", f"lora_{a_tag}") not in shapes:
                raise LoraFormatError(f"{path}: {name!r} has no lora_{a_tag}")
            continue
        b_name = name.replace(f"lora_{a_tag}", f"lora_{b_tag}")
        if b_name not in shapes:
            raise LoraFormatError(f"{path}: {name!r} has no lora_{b_tag}")
        for n, (dt, shape) in ((name, (dtype, a_shape)), (b_name, shapes[b_name])):
            if len(shape) != 2:
                raise LoraFormatError(f"{path}: {n!r} has shape {list(shape)}; LoRA "
                                      "matrices are 2-D")
            if not is_gguf and dt not in _FLOAT_DTYPES:
                raise LoraFormatError(f"{path}: {n!r} is {dt}; LoRA matrices are "
                                      f"floating-point ({', '.join(_FLOAT_DTYPES)})")
        rank = _check_pair(cfg, path, layer, proj, a_shape, shapes[b_name][1], rank)
        num_pairs += 1
    if not num_pairs:
        raise LoraFormatError(f"the LoRA adapter at {path!r} has no q/k/v/o/gate/up/down "
                              "matrices")


def _check_pair(cfg: ModelConfig, where: str, layer: int, proj: str, a: tuple, b: tuple,
                rank: int | None) -> int:
    """The pair's rank, once its A [r, in] and B [out, r] fit layer ``layer``'s ``proj``."""
    if not 0 <= layer < cfg.num_layers:
        raise LoraFormatError(f"{where}: layer {layer} does not exist; the base model has "
                              f"{cfg.num_layers} layers")
    linear, idx = TARGETS[proj]
    outs, in_features = part_sizes(cfg, linear)
    r = a[0]
    if r < 1 or a[1] != in_features or b[0] != outs[idx] or b[1] != r:
        raise LoraFormatError(f"{where}: layer {layer} {proj}: A {a} and B {b} do not fit the "
                              f"base model (A [r, {in_features}], B [{outs[idx]}, r]); is it "
                              "an adapter for another base model?")
    if rank is not None and r != rank:
        said = "the adapter's other matrices have" if where.endswith(".gguf") else \
            "the config says"
        raise LoraFormatError(f"{where}: layer {layer} {proj} has rank {r}, {said} {rank}")
    return r


@functools.lru_cache(maxsize=16)
def lora_base_config(model_path: str) -> ModelConfig:
    """The shape an adapter must fit, read torch-free from the base's ``config.json`` or GGUF
    metadata (the fields the checks use; the engine reads the rest). `LoraFormatError` for
    an architecture LoRA is not supported on."""
    if os.path.isdir(model_path):
        with open(os.path.join(model_path, "config.json")) as f:
            c = json.load(f)
        arch = (c.get("architectures") or ["?"])[0]
        get = c.get
        keys = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size")
    else:
        from radixserve.gguf_reader import open_gguf

        reader = open_gguf(model_path)
        gguf_arch = reader.fields["general.architecture"].contents()

        def get(key: str):
            f = reader.fields.get(f"{gguf_arch}.{key}")
            return None if f is None else f.contents()

        arch = ("MixtralForCausalLM" if get("expert_count")
                else GGUF_ARCHITECTURES.get(gguf_arch, gguf_arch))
        keys = ("embedding_length", "block_count", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "feed_forward_length")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise LoraFormatError(f"LoRA adapters are not supported for {arch}; supported: "
                              f"{list(SUPPORTED_ARCHITECTURES)}")
    hidden, num_layers, heads, kv_heads, head_dim, intermediate = (get(k) for k in keys)
    return ModelConfig(arch, 0, hidden, num_layers, heads, kv_heads or heads,
                       head_dim or hidden // heads, intermediate)


def check_lora_modules(model_path: str, modules: list[tuple[str, str]]) -> None:
    """The adapters given at start (``--lora NAME=PATH``) checked as a run-time load checks
    one: ValueError naming the flag and the problem (a missing path too)."""
    for name, path in modules:
        try:
            check_lora_adapter(path, lora_base_config(model_path))
        except (ValueError, OSError) as exc:
            raise ValueError(f"--lora {name}={path}: {exc}") from None
