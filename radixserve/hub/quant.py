"""Which GGUF file of a repo a reference means: quant labels read from file names the way
``llama-server -hf`` and Ollama's ``hf.co/`` pulls read them, split files grouped into one
model, ``mmproj`` projector files never taken for the model."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from radixserve.hub.errors import HubError

DEFAULT_LABEL = "Q4_K_M"  # what llama.cpp and Ollama pick when a repo has several

# A quant label at a name boundary: Q4_K_M, q8_0, IQ4_XS, TQ1_0, BF16, F16, MXFP4, and
# Unsloth's UD-Q4_K_XL. The last one in the name wins (a model's name may hold digits).
_LABEL = re.compile(
    r"(?:^|[-._])(?P<label>(?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32|FP16|FP32"
    r"|MXFP4(?:_MOE)?))(?=$|[-._])", re.IGNORECASE)
# llama.cpp's gguf-split names: NAME-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def quant_label(path: str) -> str | None:
    """The quant label of a GGUF file (upper case), from its name or else its folder's
    (large quants often sit in a folder named for them); None when neither names one."""
    for part in (_stem(posixpath.basename(path)), posixpath.basename(posixpath.dirname(path))):
        found = list(_LABEL.finditer(part))
        if found:
            return found[-1].group("label").upper()
    return None


def is_projector(path: str) -> bool:
    """A multimodal projector (``mmproj-*.gguf``): beside a model, never the model."""
    return "mmproj" in posixpath.basename(path).lower()


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """One model in a repo: its label (None: the name has none) and its files, in order (one
    file, or the parts of a split model)."""

    label: str | None
    files: tuple[str, ...]

    @property
    def is_split(self) -> bool:
        return len(self.files) > 1

    @property
    def stem(self) -> str:
        """The model's file name without the split suffix or ``.gguf``."""
        return _stem(posixpath.basename(self.files[0]))


def group_models(paths: list[str]) -> list[ModelFiles]:
    """The repo's models: every non-projector ``*.gguf``, the parts of a split file grouped
    (a split model missing a part is left out), sorted by file name."""
    singles: list[ModelFiles] = []
    splits: dict[str, dict[int, str]] = {}
    counts: dict[str, int] = {}
    for path in sorted(paths):
        if not path.lower().endswith(".gguf") or is_projector(path):
            continue
        m = _SPLIT.match(posixpath.basename(path))
        if m is None:
            singles.append(ModelFiles(quant_label(path), (path,)))
            continue
        key = posixpath.join(posixpath.dirname(path), m["stem"])
        splits.setdefault(key, {})[int(m["no"])] = path
        counts[key] = int(m["count"])
    for key, parts in splits.items():
        if sorted(parts) == list(range(1, counts[key] + 1)):
            files = tuple(parts[i] for i in sorted(parts))
            singles.append(ModelFiles(quant_label(files[0]), files))
    return sorted(singles, key=lambda m: m.files[0])


def pick_model(models: list[ModelFiles], tag: str | None, where: str) -> ModelFiles:
    """The model a tag means: a label (case-insensitive) or a file name; no tag: the only
    model, else the Q4_K_M one. HubError listing the labels there are otherwise (``where``
    names the repo in the message)."""
    if not models:
        raise HubError(f"{where} holds no GGUF model file")
    if tag is None:
        if len(models) == 1:
            return models[0]
        tag = DEFAULT_LABEL
        how = f"it holds several models and none is {DEFAULT_LABEL} (the default)"
    else:
        how = f"it has no {tag!r} model"
    wanted = tag.upper()
    found = [m for m in models if m.label == wanted] or \
        [m for m in models if tag in m.files or tag == posixpath.basename(m.files[0])]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(m.files[0] for m in found)
        raise HubError(f"{where}: {len(found)} files are labelled {wanted} ({names}); "
                       "name one as the tag, e.g. :FILE.gguf")
    raise HubError(f"{where}: {how}; pick one of: {', '.join(available_labels(models))}")


def available_labels(models: list[ModelFiles]) -> list[str]:
    """A tag for each model: its label, or its file name when it has none (or shares it)."""
    counts: dict[str | None, int] = {}
    for m in models:
        counts[m.label] = counts.get(m.label, 0) + 1
    return [m.label if m.label and counts[m.label] == 1 else posixpath.basename(m.files[0])
            for m in models]


def _stem(name: str) -> str:
    m = _SPLIT.match(name)
    return m["stem"] if m else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
