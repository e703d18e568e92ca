"""Download a model from the Hugging Face hub into huggingface_hub's cache: the GGUF file a
reference names (each part of a split one), with the library's progress bar, retries and
resumption (an interrupted transfer goes on from where it broke off, by HTTP Range), then
its sha256 checked against the LFS oid the hub lists (the library checks only the size)."""

from __future__ import annotations

import hashlib
import os
import sys

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from radixserve.hub.cache import PulledModel, cache_dir, find_pulled, model_path
from radixserve.hub.errors import HubError
from radixserve.hub.quant import group_models, pick_model
from radixserve.hub.ref import HubRef


class HubUnreachable(HubError):
    """The hub did not answer (no network, a wrong HF_ENDPOINT, or it is down)."""


def pull(ref: HubRef) -> PulledModel:
    """Bring the model ``ref`` names into the cache (files already there are not fetched
    again) and return it. HubError: no such repo or quant (the message lists the labels the
    repo has), a corrupt download (removed again), or `HubUnreachable`."""
    endpoint = constants.ENDPOINT
    info = _model_info(ref, endpoint)
    siblings = {s.rfilename: s for s in info.siblings or []}
    model = pick_model(group_models(list(siblings)), ref.tag, ref.name)
    paths = []
    for name in model.files:
        cached = try_to_load_from_cache(ref.repo_id, name, cache_dir=cache_dir(),
                                        revision=info.sha)
        path = _download(ref, name, endpoint)
        if not isinstance(cached, str):  # fetched now: check what arrived
            _verify(path, siblings[name], ref)
        paths.append(path)
    snapshot = paths[0][:len(paths[0]) - len(model.files[0])].rstrip("/" + os.sep)
    model_path(ref.repo_id, os.path.basename(snapshot), model, snapshot)  # joins a split once
    return find_pulled(ref.with_tag(model.label or os.path.basename(model.files[0])))


def _model_info(ref: HubRef, endpoint: str):
    """The repo at ``ref.revision`` with its files' sizes and LFS hashes."""
    try:
        return HfApi(endpoint=endpoint).model_info(ref.repo_id, revision=ref.revision,
                                                   files_metadata=True)
    except GatedRepoError:
        raise HubError(f"{ref.name} is gated: accept its terms on the hub and set HF_TOKEN "
                       "(or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{ref.name}: no such repository on {endpoint} (a private one needs "
                       "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{ref.name}: the repository has no revision {ref.revision!r}") from None
    except (httpx2.TransportError, OfflineModeIsEnabled, HfHubHTTPError) as exc:
        raise _unreachable(endpoint, exc) from None


def _download(ref: HubRef, name: str, endpoint: str) -> str:
    """The file's path in the snapshot folder (the library records ``ref.revision`` -> its
    commit in the cache's refs, which offline look-ups follow)."""
    try:
        return hf_hub_download(ref.repo_id, name, revision=ref.revision, cache_dir=cache_dir(),
                               endpoint=endpoint)
    except (httpx2.TransportError, HfHubHTTPError, OSError) as exc:
        if isinstance(exc, HfHubHTTPError) and exc.response is not None \
                and exc.response.status_code < 500:
            raise HubError(f"{ref.name}: downloading {name} failed: {exc}") from None
        raise _unreachable(endpoint, exc) from None


def _verify(path: str, sibling, ref: HubRef) -> None:
    """The file's hash against the hub's: sha256 for an LFS file (every GGUF on the hub), the
    git blob id otherwise. A mismatch removes the file (blob and snapshot link) so the next
    pull fetches it again, and raises HubError."""
    if sibling.lfs is not None:
        expected, kind = sibling.lfs.sha256, "sha256"
        print(f"radixserve: checking the sha256 of {sibling.rfilename} ...", file=sys.stderr,
              flush=True)
        with open(path, "rb") as f:
            actual = hashlib.file_digest(f, "sha256").hexdigest()
    elif sibling.blob_id is not None:
        expected, kind = sibling.blob_id, "git blob id"
        digest = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        actual = digest.hexdigest()
    else:
        return  # the hub listed no hash for it
    if actual != expected:
        blob = os.path.realpath(path)
        for doomed in (path, blob):
            if os.path.lexists(doomed):
                os.remove(doomed)
        raise HubError(f"{ref.name}: the download of {sibling.rfilename} is corrupt (its {kind} "
                       f"is {actual}, the hub lists {expected}); it was removed: pull again")


def _unreachable(endpoint: str, exc: Exception) -> HubUnreachable:
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachable("offline (HF_HUB_OFFLINE is set): only pulled models can be used")
    return HubUnreachable(f"cannot reach the Hugging Face hub at {endpoint} "
                          f"({type(exc).__name__}: {exc}); check the network or HF_ENDPOINT")
