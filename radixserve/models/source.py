"""ModelSource: where a model is (GGUF file or Hugging Face folder). Imports no torch, so the
API process can resolve a model without loading the engine."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from radixserve.models.default import default_model_path


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf" | "hf"
    path: str
    name: str

    @classmethod
    def resolve(cls, model: str | None) -> ModelSource:
        """None → the embedded model; a ``.gguf`` file; or a HF folder. FileNotFoundError else."""
        path = default_model_path() if model is None else os.path.expanduser(model)
        if os.path.isfile(path):
            return cls("gguf", path, os.path.basename(path).removesuffix(".gguf"))
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise FileNotFoundError(f"{path} is a folder without config.json")
            if not glob.glob(os.path.join(path, "*.safetensors")):
                raise FileNotFoundError(f"{path} holds no *.safetensors files")
            return cls("hf", path, os.path.basename(os.path.normpath(path)))
        raise FileNotFoundError(f"model not found: {path} (expected a .gguf file or a folder "
                                "with config.json and *.safetensors)")
