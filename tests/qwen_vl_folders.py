"""Weight-free Qwen2.5-VL and Qwen3.5 folders for the API side of images (preprocessing and
prompt), and transformers' own processors for them.

:func:`make_qwen_vl_folder` writes what the API process reads of a release: config.json
(model_type, architectures, the image token ids, vision_config's patch / merge / temporal
sizes), preprocessor_config.json (``RELEASE_PREPROCESSORS``: the releases' files, each family
with its own spelling of the pixel limits, optionally changed), and the tiny tokenizer of
tests/tiny_models.py with Qwen's vision specials appended (ids 384 on) and the family's
released chat template (Qwen/Qwen2.5-VL-7B-Instruct's chat_template.json; Qwen3.5's from
tests/chat_templates/Qwen3.5-4B.jinja) in tokenizer_config.json and chat_template.json.

:func:`hf_processor` builds transformers' ``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor`` (what
AutoProcessor gives these folders) with the slow image processor and no video processor
(transformers' video processors need torchvision, which is not installed; only the class
check for that argument is skipped, images go through transformers' own code).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tiny_models import save_tokenizer

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
SPECIALS = (VISION_START, VISION_END, "<|vision_pad|>", IMAGE_PAD, "<|video_pad|>")
QWEN25_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN35_TEMPLATE = (Path(__file__).parent / "chat_templates" / "Qwen3.5-4B.jinja").read_text(
    encoding="utf-8")
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# the releases' preprocessor_config.json (Qwen/Qwen2.5-VL-7B-Instruct, Qwen/Qwen3.5-4B)
RELEASE_PREPROCESSORS = {
    "qwen2.5-vl": {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                   "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN,
                   "image_std": CLIP_STD, "image_processor_type": "Qwen2VLImageProcessor",
                   "processor_class": "Qwen2_5_VLProcessor"},
    "qwen3.5": {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast"},
}
FAMILIES = {  # family -> (model_type, architecture, chat template)
    "qwen2.5-vl": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", QWEN25_VL_TEMPLATE),
    "qwen3.5": ("qwen3_5", "Qwen3_5ForConditionalGeneration", QWEN35_TEMPLATE),
}


def make_qwen_vl_folder(path: str | Path, family: str, **preprocessor_changes) -> Path:
    """Write a weight-free ``family`` ("qwen2.5-vl" or "qwen3.5") folder (module docstring)
    at ``path``, its preprocessor_config.json the release's updated by
    ``preprocessor_changes`` (a None value removes that key); returns ``path``."""
    model_type, architecture, template = FAMILIES[family]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, chat_template=template)
    start, end, image = tokenizer.convert_tokens_to_ids([VISION_START, VISION_END, IMAGE_PAD])
    preprocessor = {k: v for k, v in {**RELEASE_PREPROCESSORS[family],
                                      **preprocessor_changes}.items() if v is not None}
    vision = {"patch_size": RELEASE_PREPROCESSORS[family]["patch_size"],
              "spatial_merge_size": 2, "temporal_patch_size": 2}
    config = {"architectures": [architecture], "model_type": model_type,
              "image_token_id": image, "vision_start_token_id": start,
              "vision_end_token_id": end, "vision_config": vision}
    for name, data in (("config.json", config), ("preprocessor_config.json", preprocessor),
                       ("chat_template.json", {"chat_template": template})):
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def hf_image_processor(family: str, **changes):
    """transformers' slow ``Qwen2VLImageProcessor`` with the release's settings of
    ``family`` updated by ``changes`` (a None value removes that key)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    skip = {"image_processor_type", "processor_class"}
    # NOTE: a copy: transformers writes min_pixels / max_pixels into the size dict it is given
    settings = copy.deepcopy({**RELEASE_PREPROCESSORS[family], **changes})
    return Qwen2VLImageProcessorPil(**{k: v for k, v in settings.items()
                                       if v is not None and k not in skip})


def hf_processor(folder: str | Path, family: str, **changes):
    """transformers' processor for a :func:`make_qwen_vl_folder` folder (module docstring):
    the folder's tokenizer and chat template, the slow image processor of
    :func:`hf_image_processor`."""
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen3VLProcessor

    base = Qwen2_5_VLProcessor if family == "qwen2.5-vl" else Qwen3VLProcessor

    class WithoutVideo(base):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return WithoutVideo(image_processor=hf_image_processor(family, **changes),
                        tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                        video_processor=None, chat_template=FAMILIES[family][2])
