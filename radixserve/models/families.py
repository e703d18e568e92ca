"""The model families whose checkpoints do not load the Llama way (models/loader.py reads the
rest itself): for each, how its config.json and GGUF metadata become a ``ModelConfig`` and how
its tensor names and values become the ones its model class takes.

A new family adds its ``Family`` to ``FAMILIES`` (one entry; its code in files of its own) and
its classes to models/registry.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from radixserve.model_config import ModelConfig
from radixserve.models.deepseek2_config import (DEEPSEEK2_ARCHITECTURES, deepseek2_hf_config,
                                                deepseek2_hf_name)
from radixserve.models.deepseek2_gguf import deepseek2_gguf_config, deepseek2_gguf_name
from radixserve.models.gemma_config import (GEMMA_ARCHITECTURES, gemma_gguf_config,
                                            gemma_hf_config, gemma_hf_name, gemma_text_name)
from radixserve.models.gemma4_config import (GEMMA4_ARCHITECTURES,
                                             gemma4_hf_config, gemma4_hf_name)
from radixserve.models.gemma4_gguf import gemma4_gguf_config, gemma4_gguf_name
from radixserve.models.granite_config import (GRANITE_ARCHITECTURES, granite_gguf_config,
                                              granite_hf_config, granite_hf_name)
from radixserve.models.granite_gguf import GraniteGguf
from radixserve.models.gpt_oss_config import (GPT_OSS_ARCHITECTURES, gpt_oss_gguf_config,
                                              gpt_oss_gguf_name, gpt_oss_hf_config,
                                              gpt_oss_hf_name)
from radixserve.models.lfm2_config import (LFM2_ARCHITECTURES, lfm2_gguf_config, lfm2_gguf_name,
                                           lfm2_hf_config, lfm2_hf_name)
from radixserve.models.nemotron_h_config import (NEMOTRON_H_ARCHITECTURES,
                                                 nemotron_h_gguf_config, nemotron_h_hf_config,
                                                 nemotron_h_hf_name)
from radixserve.models.nemotron_h_gguf import NemotronHGguf
from radixserve.models.mistral3_config import (MISTRAL3_ARCHITECTURES, mistral3_gguf_config,
                                               mistral3_hf_config, mistral3_hf_name)
from radixserve.models.olmo2_config import (OLMO_ARCHITECTURES, olmo_gguf_config,
                                            olmo_hf_config, olmo_hf_name)
from radixserve.models.qwen2_vl_config import (QWEN2_VL_ARCHITECTURES, qwen2_vl_gguf_config,
                                               qwen2_vl_hf_config, qwen2_vl_hf_name)
from radixserve.models.qwen3_vl_config import (QWEN3_VL_ARCHITECTURES, qwen3_vl_gguf_config,
                                               qwen3_vl_hf_config)
from radixserve.models.qwen3next_config import (QWEN3NEXT_ARCHITECTURES, qwen3next_hf_config,
                                                qwen3next_hf_name)
from radixserve.models.qwen3next_gguf import Qwen3NextGguf
from radixserve.models.qwen35_config import (QWEN35_ARCHITECTURES, qwen35_gguf_config,
                                             qwen35_hf_config, qwen35_hf_name)
from radixserve.models.qwen35_gguf import Qwen35Gguf
from radixserve.models.smollm3_config import (SMOLLM3_ARCHITECTURES, smollm3_gguf_config,
                                              smollm3_hf_config)
from radixserve.models.smolvlm_config import (SMOLVLM_ARCHITECTURES, smolvlm_hf_config,
                                              smolvlm_hf_name)

Weights = Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Family:
    """How one family loads.

    - ``architectures``: the config.json ``architectures[0]`` names it owns (ConditionalGeneration
      folders whose text model runs included) and the HF names its GGUF architectures map to;
    - ``hf_config(cfg, arch)``: the ModelConfig of a config.json (ValueError for what does not run);
    - ``gguf_config(reader, field, gguf_arch, arch)``: that of a GGUF file (``field(reader, key,
      default)`` reads one metadata value);
    - ``hf_name(name)``: a folder's tensor name → the model's (None: skipped); None: as stored,
      less ``model.``;
    - ``gguf_layout(config)``: where llama.cpp's converter reordered or changed tensor values
      (an object with ``hf_name``, ``row_order``, ``wrap``, ``to_hf`` and ``weights(reader)``:
      models/qwen35_gguf.py's ``Qwen35Gguf`` shows the contract; gguf_stored.py applies it);
    - ``gguf_name(name)``: a GGUF tensor name → the model's, for a family with names of its own
      and no layout.
    """

    architectures: tuple[str, ...]
    hf_config: Callable[[dict, str], ModelConfig]
    gguf_config: Callable[..., ModelConfig] | None  # None: no GGUF architecture maps here
    hf_name: Callable[[str], str | None] | None = None
    gguf_layout: Callable[[ModelConfig], object] | None = None
    gguf_name: Callable[[str], str | None] | None = None

    def hf_weights(self, weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """``hf_name`` over a folder's (name, tensor) pairs, the skipped ones left out."""
        if self.hf_name is None:
            yield from weights
            return
        for name, tensor in weights:
            if (mapped := self.hf_name(name)) is not None:
                yield mapped, tensor


FAMILIES: tuple[Family, ...] = (
    Family(SMOLLM3_ARCHITECTURES, smollm3_hf_config, smollm3_gguf_config),
    Family(OLMO_ARCHITECTURES, olmo_hf_config, olmo_gguf_config, gguf_name=olmo_hf_name),
    Family(SMOLVLM_ARCHITECTURES, smolvlm_hf_config, None, hf_name=smolvlm_hf_name),
    Family(QWEN2_VL_ARCHITECTURES, qwen2_vl_hf_config, qwen2_vl_gguf_config,
           hf_name=qwen2_vl_hf_name),
    Family(QWEN3_VL_ARCHITECTURES, qwen3_vl_hf_config, qwen3_vl_gguf_config,
           hf_name=qwen2_vl_hf_name),
    Family(MISTRAL3_ARCHITECTURES, mistral3_hf_config, mistral3_gguf_config,
           hf_name=mistral3_hf_name),
    Family(GEMMA_ARCHITECTURES, gemma_hf_config, gemma_gguf_config, hf_name=gemma_text_name,
           gguf_name=gemma_hf_name),
    Family(GEMMA4_ARCHITECTURES, gemma4_hf_config, gemma4_gguf_config, hf_name=gemma4_hf_name,
           gguf_name=gemma4_gguf_name),
    Family(QWEN35_ARCHITECTURES, qwen35_hf_config, qwen35_gguf_config, hf_name=qwen35_hf_name,
           gguf_layout=Qwen35Gguf),
    Family(QWEN3NEXT_ARCHITECTURES, qwen3next_hf_config, qwen35_gguf_config,
           hf_name=qwen3next_hf_name, gguf_layout=Qwen3NextGguf),
    Family(GRANITE_ARCHITECTURES, granite_hf_config, granite_gguf_config,
           hf_name=granite_hf_name, gguf_layout=GraniteGguf),
    Family(LFM2_ARCHITECTURES, lfm2_hf_config, lfm2_gguf_config, hf_name=lfm2_hf_name,
           gguf_name=lfm2_gguf_name),
    Family(NEMOTRON_H_ARCHITECTURES, nemotron_h_hf_config, nemotron_h_gguf_config,
           hf_name=nemotron_h_hf_name, gguf_layout=NemotronHGguf),
    Family(GPT_OSS_ARCHITECTURES, gpt_oss_hf_config, gpt_oss_gguf_config,
           hf_name=gpt_oss_hf_name, gguf_name=gpt_oss_gguf_name),
    Family(DEEPSEEK2_ARCHITECTURES, deepseek2_hf_config, deepseek2_gguf_config,
           hf_name=deepseek2_hf_name, gguf_name=deepseek2_gguf_name),
)


def family_of(architecture: str) -> Family | None:
    """The family owning ``architecture`` (an HF name), None for the Llama-path ones."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)
