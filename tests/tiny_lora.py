"""Random LoRA adapters for the tiny models (tests/tiny_models.py), made with peft, and the
same weights as a llama.cpp GGUF LoRA file; reference greedy decoding with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tiny_models import permute_qk

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GGUF = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def make_peft_adapter(base_dir: Path, out_dir: Path, seed: int, r: int = 8, alpha: int = 16,
                      targets=ALL_TARGETS, use_rslora: bool = False, std: float = 0.08) -> Path:
    """A PEFT LoRA folder for the model at ``base_dir`` with random A and B (peft starts B at
    zero, which would change nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                                            use_rslora=use_rslora, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    for name, p in peft.named_parameters():
        if "lora_" in name:
            p.data.copy_(torch.randn(p.shape, generator=gen) * std)
    peft.save_pretrained(str(out_dir))
    return out_dir


def peft_to_gguf(adapter_dir: Path, base_dir: Path, out_path: Path, arch: str = "llama") -> Path:
    """The adapter as llama.cpp's convert_lora_to_gguf.py writes it: F32 ``lora_a`` / ``lora_b``
    per ``blk.N.<tensor>.weight``, Q/K ``lora_b`` rows permuted like the base's."""
    import gguf
    from safetensors.torch import load_file

    conf = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = json.loads((base_dir / "config.json").read_text())
    heads = {"q_proj": base["num_attention_heads"],
             "k_proj": base.get("num_key_value_heads") or base["num_attention_heads"]}
    writer = gguf.GGUFWriter(str(out_path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(conf["lora_alpha"]))
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    for name, a in sorted(tensors.items()):
        if ".lora_A." not in name:
            continue
        b = tensors[name.replace(".lora_A.", ".lora_B.")].numpy()
        module = name.split(".lora_A.")[0].split(".")
        layer, proj = module[module.index("layers") + 1], module[-1]
        if proj in heads:
            b = permute_qk(b, heads[proj])
        stem = f"blk.{layer}.{_GGUF[proj]}.weight"
        writer.add_tensor(f"{stem}.lora_a", np.ascontiguousarray(a.numpy(), np.float32))
        writer.add_tensor(f"{stem}.lora_b", np.ascontiguousarray(b, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def merged_model(base_dir: Path, adapter_dir: Path, out_dir: Path) -> Path:
    """The adapter merged into the base (peft ``merge_and_unload``) saved as a model folder."""
    import shutil

    model = hf_model(base_dir, adapter_dir).merge_and_unload()
    model.save_pretrained(str(out_dir))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (base_dir / f).exists():
            shutil.copy(base_dir / f, out_dir / f)
    return out_dir


def hf_model(base_dir: Path, adapter_dir: Path | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy tokens by full forwards (no EOS stop)."""
    ids = list(prompt)
    for _ in range(num_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]
