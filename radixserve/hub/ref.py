"""Model references to the Hugging Face hub: ``hf.co/OWNER/REPO[:QUANT]``, as Ollama and
``llama-server -hf`` take them. Parsing only: no network, no cache."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from radixserve.hub.errors import HubError

# What a reference may start with; `radixserve pull` also takes a bare OWNER/REPO.
_PREFIXES = ("https://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")
# The hub's own rule for a repo id (letters, digits, '-', '_', '.'; no '--' or '..').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


@dataclass(frozen=True, slots=True)
class HubRef:
    """``repo_id`` (OWNER/REPO) and ``tag``: a quant label (Q4_K_M, case-insensitive), a file
    name ending in ``.gguf``, or None (the repo's only model file, else Q4_K_M)."""

    repo_id: str
    tag: str | None = None
    revision: str = "main"

    @property
    def name(self) -> str:
        """The canonical spelling: ``hf.co/OWNER/REPO`` with ``:TAG`` when a tag was given."""
        return f"hf.co/{self.repo_id}" + (f":{self.tag}" if self.tag else "")

    def with_tag(self, tag: str) -> HubRef:
        return HubRef(self.repo_id, tag, self.revision)


def is_hub_ref(text: str | None) -> bool:
    """True when ``text`` names a hub model (``hf.co/...``, ``huggingface.co/...``) rather
    than a local path; a path that exists on disk is always local."""
    if not text or os.path.exists(os.path.expanduser(text)):
        return False
    return text.lower().startswith(_PREFIXES)


def parse_hub_ref(text: str, bare: bool = False) -> HubRef:
    """Parse ``[hf.co/]OWNER/REPO[:TAG]`` (``bare``: the prefix may be left out). HubError
    saying what is expected when ``text`` is not such a reference."""
    rest = text.strip()
    for prefix in _PREFIXES:
        if rest.lower().startswith(prefix):
            rest = rest[len(prefix):]
            break
    else:
        if not bare:
            raise HubError(f"{text!r} is not a hub reference (expected hf.co/OWNER/REPO[:QUANT])")
    repo, _, tag = rest.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_NAME.fullmatch(p) for p in parts) or \
            any(".." in p or "--" in p for p in parts):
        raise HubError(f"{text!r}: expected [hf.co/]OWNER/REPO[:QUANT], e.g. "
                       "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    if ":" in tag:
        raise HubError(f"{text!r}: the tag after ':' is one quant label (Q4_K_M) or file name")
    return HubRef(repo, None if tag in ("", "latest") else tag)
