"""Weight-free Mistral 3 folders for the API side of images (preprocessing and prompt), and
transformers' own processors for them.

:func:`make_mistral3_folder` writes what the API process reads of a release
(mistralai/Mistral-Small-3.1-24B-Instruct-2503, mistralai/Ministral-3-*-2512): config.json
(model_type ``mistral3``, the architecture, ``image_token_index``, ``spatial_merge_size``,
vision_config's patch and image size), processor_config.json (PixtralProcessor's arguments:
patch size, merge size, the three image tokens) with the release's ``image_processor``
section (``RELEASE_IMAGE_PROCESSOR``, optionally changed; or those settings as a
preprocessor_config.json, as Mistral Small 3.1 ships them), and the tiny tokenizer of
tests/tiny_models.py with Mistral's specials appended (ids 384 on) and the released chat
template (tests/chat_templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja: ``[IMG]`` per
image part).

:func:`hf_processor` builds transformers' ``PixtralProcessor`` with the slow image processor
(``PixtralImageProcessorPil``). NOTE: transformers' processing_pixtral.py imports its sizing
function from the torchvision image processor's module, and torchvision is not installed: that
module is stood in for by the Pillow processor's module, which holds the same function (its
"Adapted from" copy); everything else is transformers' own code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tiny_models import save_tokenizer

IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
# the template's markers, then the image tokens
SPECIALS = ("<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]",
            "[/THINK]", IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN)
TEMPLATE = (Path(__file__).parent / "chat_templates"
            / "mistralai-Ministral-3-14B-Reasoning-2512.jinja").read_text(encoding="utf-8")
# the releases' image processor settings
RELEASE_IMAGE_PROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "PixtralImageProcessorFast",
    "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": 14, "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}}
RELEASE_PROCESSOR = {"image_break_token": BREAK_TOKEN, "image_end_token": END_TOKEN,
                     "image_token": IMAGE_TOKEN, "patch_size": 14,
                     "processor_class": "PixtralProcessor", "spatial_merge_size": 2}


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def make_mistral3_folder(path: str | Path, *, preprocessor_file: bool = False,
                         config_changes: dict | None = None,
                         processor_changes: dict | None = None, **changes) -> Path:
    """Write a weight-free Mistral 3 folder (module docstring) at ``path``: its image
    settings the release's updated by ``changes``, processor_config.json's top level by
    ``processor_changes``, config.json by ``config_changes`` (a None value removes that key).
    Returns ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, chat_template=TEMPLATE, bos_token="<s>",
                               eos_token="</s>")
    config = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
              "image_token_index": tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
              "spatial_merge_size": 2,
              "vision_config": {"model_type": "pixtral", "patch_size": 14, "image_size": 1540},
              **(config_changes or {})}
    processor = _drop_none({**RELEASE_PROCESSOR, **(processor_changes or {})})
    settings = _drop_none({**RELEASE_IMAGE_PROCESSOR, **changes})
    files = {"config.json": _drop_none(config), "chat_template.json": {"chat_template": TEMPLATE}}
    if preprocessor_file:
        files["preprocessor_config.json"] = {**settings, "processor_class": "PixtralProcessor"}
        files["processor_config.json"] = processor
    else:
        files["processor_config.json"] = {**processor, "image_processor": settings}
    for name, data in files.items():
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def hf_image_processor(**changes):
    """transformers' ``PixtralImageProcessorPil`` with the release's settings updated by
    ``changes`` (a None value removes that key: transformers' default)."""
    from transformers.models.pixtral.image_processing_pil_pixtral import (
        PixtralImageProcessorPil,
    )

    settings = _drop_none({**RELEASE_IMAGE_PROCESSOR, **changes})
    settings.pop("image_processor_type")
    return PixtralImageProcessorPil(**settings)


def hf_processor(folder: str | Path, patch_size: int = 14, spatial_merge_size: int = 2,
                 **changes):
    """transformers' ``PixtralProcessor`` for a :func:`make_mistral3_folder` folder (module
    docstring): its tokenizer and chat template, the image processor of
    :func:`hf_image_processor`."""
    from transformers import AutoTokenizer
    from transformers.models.pixtral import image_processing_pil_pixtral

    # NOTE: the stand-in of the module docstring, only where torchvision is missing
    sys.modules.setdefault("transformers.models.pixtral.image_processing_pixtral",
                           image_processing_pil_pixtral)
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    return PixtralProcessor(image_processor=hf_image_processor(**changes),
                            tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                            patch_size=patch_size, spatial_merge_size=spatial_merge_size,
                            chat_template=TEMPLATE)
