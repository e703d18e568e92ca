"""Models from the Hugging Face hub: ``hf.co/OWNER/REPO[:QUANT]`` references, pulled into
huggingface_hub's cache and served from there. Imports no torch (the API process resolves
``--model`` with it)."""

from __future__ import annotations

import sys

from radixserve.hub.errors import HubError, ModelNotPulled
from radixserve.hub.ref import HubRef, is_hub_ref, parse_hub_ref

__all__ = ["HubError", "HubRef", "ModelNotPulled", "is_hub_ref", "parse_hub_ref",
           "resolve_model"]


def resolve_model(model: str | None, offline: bool = False) -> str | None:
    """``model`` as a local path: a hub reference is pulled (or, offline, looked up in the
    cache), anything else is returned unchanged. Offline: ``offline`` or HF_HUB_OFFLINE.
    When the hub cannot be reached, a pulled copy is used (with a warning on stderr).
    ModelNotPulled offline when the cache lacks it; HubError for the rest."""
    if not is_hub_ref(model):
        return model
    # huggingface_hub and its HTTP stack load only when a reference is given: a local path
    # (every test, every engine process) does without them
    from huggingface_hub import constants

    from radixserve.hub.cache import cache_dir, find_pulled
    from radixserve.hub.pull import HubUnreachable, pull

    ref = parse_hub_ref(model)
    if offline or constants.is_offline_mode():
        try:
            return find_pulled(ref).path
        except ModelNotPulled as exc:
            raise ModelNotPulled(f"{exc}, and offline the hub is not asked: run `radixserve "
                                 f"pull {ref.name}` while online") from None
    try:
        return pull(ref).path
    except HubUnreachable as exc:
        try:
            found = find_pulled(ref)
        except ModelNotPulled:
            raise HubUnreachable(f"{exc}; {ref.name} is not in the cache ({cache_dir()}) "
                                 "either") from None
        print(f"radixserve: warning: {exc}; using the pulled {found.name}", file=sys.stderr)
        return found.path
