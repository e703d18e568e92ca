"""Weight-free Gemma 4 folders for the API side of images (preprocessing and prompt), and
transformers' own processors for them.

:func:`make_gemma4_folder` writes what the API process reads of a release
(google/gemma-4-*-it): config.json (model_type, architectures, the image token ids,
vision_config's patch size and pooling kernel), processor_config.json with the release's
``image_processor`` section (``RELEASE_IMAGE_PROCESSOR``, optionally changed; or the same
settings as a preprocessor_config.json), and the tiny tokenizer of tests/tiny_models.py with
Gemma 4's specials appended (ids 384 on; named as the release's tokenizer_config.json names
them: ``image_token``, ``boi_token``, ...) and the released chat template
(tests/chat_templates/google-gemma-4-31B-it.jinja).

:func:`hf_processor` builds transformers' ``Gemma4Processor`` with the slow image processor
(``Gemma4ImageProcessorPil``) and no video processor (transformers' video processors need
torchvision, which is not installed; only the class check for that argument is skipped,
images go through transformers' own code).
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_models import save_tokenizer

IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN = "<|image|>", "<|image>", "<image|>"
NAMED_SPECIALS = {"boi_token": BOI_TOKEN, "eoi_token": EOI_TOKEN, "image_token": IMAGE_TOKEN,
                  "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>"}
# the template's turn and channel markers, then the media tokens
SPECIALS = ("<|turn>", "<turn|>", "<|channel>", "<channel|>", *NAMED_SPECIALS.values(),
            "<|video|>")
TEMPLATE = (Path(__file__).parent / "chat_templates" / "google-gemma-4-31B-it.jinja").read_text(
    encoding="utf-8")
# the releases' processor_config.json "image_processor" section
RELEASE_IMAGE_PROCESSOR = {
    "do_convert_rgb": True, "do_normalize": False, "do_rescale": True, "do_resize": True,
    "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
    "image_processor_type": "Gemma4ImageProcessor", "image_seq_length": 280,
    "max_soft_tokens": 280, "patch_size": 16, "pooling_kernel_size": 3, "resample": 3,
    "rescale_factor": 0.00392156862745098}


def make_gemma4_folder(path: str | Path, *, preprocessor_file: bool = False,
                       config_changes: dict | None = None, **changes) -> Path:
    """Write a weight-free Gemma 4 folder (module docstring) at ``path``: its image settings
    the release's updated by ``changes`` (a None value removes that key), in
    processor_config.json (or preprocessor_config.json with ``preprocessor_file``);
    config.json updated by ``config_changes`` alike. Returns ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path, SPECIALS, chat_template=TEMPLATE,
                               extra_special_tokens=NAMED_SPECIALS)
    boi, eoi, image = tokenizer.convert_tokens_to_ids([BOI_TOKEN, EOI_TOKEN, IMAGE_TOKEN])
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "image_token_id": image, "boi_token_id": boi, "eoi_token_id": eoi,
              "vision_config": {"model_type": "gemma4_vision", "patch_size": 16,
                                "pooling_kernel_size": 3},
              **(config_changes or {})}
    settings = _settings(**changes)
    files = {"config.json": {k: v for k, v in config.items() if v is not None},
             "chat_template.json": {"chat_template": TEMPLATE}}
    if preprocessor_file:
        files["preprocessor_config.json"] = {**settings, "processor_class": "Gemma4Processor"}
    else:
        files["processor_config.json"] = {"image_processor": settings, "image_seq_length": 280,
                                          "processor_class": "Gemma4Processor"}
    for name, data in files.items():
        (path / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _settings(**changes) -> dict:
    return {k: v for k, v in {**RELEASE_IMAGE_PROCESSOR, **changes}.items() if v is not None}


def hf_image_processor(**changes):
    """transformers' ``Gemma4ImageProcessorPil`` with the release's settings updated by
    ``changes`` (a None value removes that key: transformers' default)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    skip = {"image_processor_type", "image_seq_length"}
    return Gemma4ImageProcessorPil(**{k: v for k, v in _settings(**changes).items()
                                      if k not in skip})


def hf_processor(folder: str | Path, **changes):
    """transformers' ``Gemma4Processor`` for a :func:`make_gemma4_folder` folder (module
    docstring): its tokenizer and chat template, the image processor of
    :func:`hf_image_processor`, transformers' (numpy) audio feature extractor."""
    from transformers import AutoTokenizer, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

    class WithoutVideo(Gemma4Processor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return WithoutVideo(feature_extractor=Gemma4AudioFeatureExtractor(),
                        image_processor=hf_image_processor(**changes),
                        tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                        video_processor=None, chat_template=TEMPLATE)
