"""How many multi-token-prediction (MTP) layers a checkpoint holds, for ``--speculative mtp``.

Qwen3.5 / 3.6 and Qwen3-Next checkpoints carry an MTP block beside the decoder: a Hugging Face
folder as ``mtp.*`` tensors (``mtp.layers.N.*`` per layer), a GGUF file as llama.cpp's
converter writes it, ``nextn_predict_layers`` blocks after the decoder's (``blk.N.nextn.*``
plus the layer's own tensors). Files made with the converter's ``--no-mtp`` (and folders
whose uploader stripped the block) hold none.
"""

from __future__ import annotations

import glob
import json
import os
import re

from radixserve.model_config import ModelConfig

# the architectures whose model class runs an MTP block (models/qwen35.py: MtpBlock)
MTP_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM")
_HF_LAYER = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")


def mtp_layers_in(source, config: ModelConfig, reader=None) -> int:
    """The MTP layers the checkpoint at ``source`` holds (0: none, or a model class that runs
    none); ``reader``: the open GGUF reader of a GGUF source."""
    if config.architecture not in MTP_ARCHITECTURES:
        return 0
    if source.kind == "gguf":
        return _gguf_layers(reader, config.num_layers)
    return _hf_layers(source.path)


def _gguf_layers(reader, num_layers: int) -> int:
    arch = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{arch}.nextn_predict_layers")
    declared = int(field.contents()) if field is not None else 0
    names = {t.name for t in reader.tensors}
    # the block's own tensors must be there (a --no-mtp file may keep the key)
    return sum(1 for i in range(declared)
               if f"blk.{num_layers + i}.nextn.eh_proj.weight" in names)


def _hf_layers(path: str) -> int:
    """From the folder's safetensors index, else the files' headers."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = list(json.load(f).get("weight_map", {}))
    else:
        from safetensors import safe_open

        names = []
        for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            with safe_open(file, framework="pt") as f:
                names += list(f.keys())
    layers = {int(m.group(1)) for n in names if (m := _HF_LAYER.match(n))}
    has_fc = any(n.removeprefix("model.") == "mtp.fc.weight" for n in names)
    return len(layers) if has_fc else 0
