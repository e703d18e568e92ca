"""Malformed LoRA adapters, each made from a good one, for the tests and the reliability probe
(benchmarks/reliability/lora_attacks.py). Torch-free: numpy, safetensors and gguf only.

`malformed_adapters` returns name → (path, a fragment the 400's message must hold); every one
of them once took the engine down (issue 62) or is a near neighbour of one that did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

_WEIGHTS = "adapter_model.safetensors"
_CONFIG = "adapter_config.json"


def write_peft_adapter(out_dir: Path, hidden: int, q_out: int, kv_out: int, num_layers: int,
                       r: int = 4, seed: int = 0) -> Path:
    """A PEFT LoRA folder (q/v of every layer, random F32 A and B) for a base whose q_proj maps
    ``hidden`` to ``q_out`` and v_proj ``hidden`` to ``kv_out``, as peft writes one."""
    rng = np.random.default_rng(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for layer in range(num_layers):
        for proj, out in (("q_proj", q_out), ("v_proj", kv_out)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{stem}.lora_A.weight"] = rng.normal(0, 0.02, (r, hidden)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.normal(0, 0.02, (out, r)).astype(np.float32)
    save_file(tensors, str(out_dir / _WEIGHTS), metadata={"format": "pt"})
    (out_dir / _CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "bias": "none",
        "target_modules": ["q_proj", "v_proj"], "use_rslora": False, "use_dora": False}))
    return out_dir


def _variant(good: Path, out: Path, conf=None, tensors: dict | None = None,
             raw: bytes | None = None, config_text: str | None = None) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(good, out)
    if conf is not None:
        (out / _CONFIG).write_text(json.dumps(conf))
    if config_text is not None:
        (out / _CONFIG).write_text(config_text)
    if tensors is not None:
        save_file(tensors, str(out / _WEIGHTS))
    if raw is not None:
        (out / _WEIGHTS).write_bytes(raw)
    return out


def _renamed(tensors: dict, old: str, new: str) -> dict:
    return {k.replace(old, new): v for k, v in tensors.items()}


def _gguf(path: Path, tensors: dict[str, np.ndarray], arch: str = "llama") -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 8.0)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def malformed_adapters(good: Path, root: Path,
                       gguf_arch: str = "llama") -> dict[str, tuple[Path, str]]:
    """Adapters made from the PEFT folder ``good`` under ``root`` (GGUF ones for a
    ``gguf_arch`` base): name → (path, a fragment of the error that must name the problem)."""
    root.mkdir(parents=True, exist_ok=True)
    conf = json.loads((good / _CONFIG).read_text())
    data = (good / _WEIGHTS).read_bytes()
    t = load_file(str(good / _WEIGHTS))
    first_a = next(k for k in t if ".lora_A." in k)
    a, b = t[first_a], t[first_a.replace(".lora_A.", ".lora_B.")]
    no_r = {k: v for k, v in conf.items() if k != "r"}
    rand = np.random.default_rng(0)

    def v(name: str, **kw) -> Path:
        return _variant(good, root / name, **kw)

    cases = {
        "random_safetensors": (v("random_safetensors", raw=rand.bytes(4096)),
                               "not a safetensors file"),
        "truncated_safetensors": (v("truncated_safetensors", raw=data[:len(data) // 2]),
                                  "not a safetensors file"),
        "empty_safetensors": (v("empty_safetensors", raw=b""), "not a safetensors file"),
        "config_without_r": (v("config_without_r", conf=no_r), "'r'"),
        "r_zero": (v("r_zero", conf={**conf, "r": 0}), "'r' must be a positive integer"),
        "r_negative": (v("r_negative", conf={**conf, "r": -4}), "'r' must be a positive"),
        "r_string": (v("r_string", conf={**conf, "r": "eight"}), "'r' must be a positive"),
        "r_nan": (v("r_nan", config_text=json.dumps({**conf, "r": float("nan")})),
                  "'r' must be a positive"),
        "alpha_object": (v("alpha_object", conf={**conf, "lora_alpha": {"x": 1}}),
                         "'lora_alpha' must be a number"),
        "config_list": (v("config_list", conf=[conf]), "must hold a JSON object"),
        "config_not_json": (v("config_not_json", config_text="{r: 8,"), "not valid JSON"),
        "zero_d_tensor": (v("zero_d_tensor", tensors={**t, first_a: np.array(1.0, np.float32)}),
                          "2-D"),
        "three_d_tensor": (v("three_d_tensor", tensors={**t, first_a: a[None]}), "2-D"),
        "int_tensor": (v("int_tensor", tensors={**t, first_a: a.astype(np.int32)}),
                       "floating-point"),
        "no_layer_index": (v("no_layer_index", tensors=_renamed(t, "layers.0.", "layers.")),
                           "no layer index"),
        "layer_index_last": (v("layer_index_last", tensors={
            "base_model.model.model.layers.lora_A.weight": a,
            "base_model.model.model.layers.lora_B.weight": b}), "is not supported"),
        "layer_out_of_range": (v("layer_out_of_range", tensors=_renamed(
            t, "layers.0.", "layers.99999999999999999999.")), "does not exist"),
        "a_without_b": (v("a_without_b", tensors={first_a: a}), "has no lora_B"),
        "no_tensors": (v("no_tensors", raw=_empty_safetensors()), "no q/k/v/o/gate/up/down"),
        "wrong_shape": (v("wrong_shape", tensors={**t, first_a: a[:, :-1].copy()}),
                        "do not fit the base model"),
        "random_gguf": (_write(root / "random.gguf", rand.bytes(4096)), "not a GGUF file"),
        "gguf_name_without_layer": (_gguf(root / "no_layer.gguf", {
            "lora_a": a.copy(), "lora_b": b.copy()}, gguf_arch), "not supported"),
        "gguf_layer_not_a_number": (_gguf(root / "bad_layer.gguf", {
            "blk.x.attn_q.weight.lora_a": a.copy(), "blk.x.attn_q.weight.lora_b": b.copy()},
            gguf_arch), "no layer index"),
    }
    gguf_data = (root / "no_layer.gguf").read_bytes()
    cases["truncated_gguf"] = (_write(root / "truncated.gguf", gguf_data[:len(gguf_data) // 2]),
                               "not a GGUF file")
    return cases


def _empty_safetensors() -> bytes:
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    return len(header).to_bytes(8, "little") + header


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
