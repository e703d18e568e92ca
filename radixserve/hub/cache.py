"""Pulled models in huggingface_hub's cache (``HF_HUB_CACHE``, by default
``~/.cache/huggingface/hub``): find one, list them, remove them. No network.

A split model's parts stay in the cache as the hub has them; the file the engine loads is
their join, kept beside the repo's snapshots in ``radixserve-joined/COMMIT/NAME.gguf`` (the
hub's cache tools ignore the folder, and deleting the repo deletes it)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass

from huggingface_hub import constants, scan_cache_dir
from huggingface_hub.errors import CacheNotFound
from huggingface_hub.file_download import repo_folder_name

from radixserve.hub.errors import HubError, ModelNotPulled
from radixserve.hub.join import join_split_gguf
from radixserve.hub.quant import ModelFiles, available_labels, group_models, pick_model
from radixserve.hub.ref import HubRef

JOINED_FOLDER = "radixserve-joined"


@dataclass(frozen=True, slots=True)
class PulledModel:
    """One model in the cache: ``name`` (``hf.co/OWNER/REPO:LABEL``) and ``path``, the one
    ``.gguf`` to load (a split model's join)."""

    name: str
    path: str
    size_bytes: int  # its files in the cache (the parts, for a split model)
    modified: float  # when its newest file was downloaded (Unix time)
    commit: str


def cache_dir() -> str:
    return constants.HF_HUB_CACHE


def model_path(repo_id: str, commit: str, model: ModelFiles, snapshot: str) -> str:
    """The file to load for ``model`` of the snapshot folder ``snapshot``: the file itself,
    or, for a split model, the parts' join (written now if it is not there yet)."""
    if not model.is_split:
        return os.path.join(snapshot, model.files[0])
    dest = os.path.join(cache_dir(), repo_folder_name(repo_id=repo_id, repo_type="model"),
                        JOINED_FOLDER, commit, model.stem + ".gguf")
    if not os.path.isfile(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        join_split_gguf([os.path.join(snapshot, f) for f in model.files], dest)
    return dest


def find_pulled(ref: HubRef) -> PulledModel:
    """The cached model ``ref`` names, from the revision its ``revision`` (main) last pointed
    at, else the newest revision holding it. ModelNotPulled (listing what is cached of the
    repo) when there is none such. Writes a split model's join if it is missing."""
    revisions = sorted(_revisions(ref.repo_id),
                       key=lambda r: (ref.revision not in r.refs, -r.last_modified))
    labels: list[str] = []
    for rev in revisions:
        models = group_models(_relative_files(rev))
        model = _try_pick(models, ref)
        if model is not None:
            return _pulled(ref.repo_id, rev, model)
        labels += [label for label in available_labels(models) if label not in labels]
    have = f"; pulled from this repo: {', '.join(labels)}" if labels else ""
    raise ModelNotPulled(f"{ref.name} is not in the cache ({cache_dir()}){have}")


def pulled_models() -> list[PulledModel]:
    """Every complete GGUF model in the cache, newest revision first within a name, sorted by
    name (a name pulled at several revisions is listed once: its newest)."""
    found: dict[str, PulledModel] = {}
    for repo in _model_repos():
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            for model in group_models(_relative_files(rev)):
                name = _name(repo.repo_id, model)
                if name not in found:
                    found[name] = _pulled(repo.repo_id, rev, model, join=False)
    return [found[n] for n in sorted(found)]


def remove_pulled(ref: HubRef) -> list[str]:
    """Delete the cached model ``ref`` names (no tag: every model of the repo) at every
    revision, with a split model's join; a revision left empty goes with its refs. The names
    removed (empty: nothing of the kind was cached). Only blobs no other file uses go."""
    removed: set[str] = set()
    for repo in _model_repos(ref.repo_id):
        kept_blobs = set()
        doomed = []
        for rev in repo.revisions:
            by_path = _files_by_path(rev)
            hit = [m for m in group_models(list(by_path))
                   if ref.tag is None or _try_pick([m], ref) is not None]
            hit_files = {f for m in hit for f in m.files}
            kept_blobs |= {f.blob_path for p, f in by_path.items() if p not in hit_files}
            doomed += [by_path[f] for f in hit_files]
            for m in hit:
                removed.add(_name(repo.repo_id, m))
                joined = os.path.join(repo.repo_path, JOINED_FOLDER, rev.commit_hash)
                _remove(os.path.join(joined, m.stem + ".gguf"))
                with contextlib.suppress(OSError):
                    os.rmdir(joined)  # when it was the last
        for f in doomed:
            _remove(f.file_path)
            if f.blob_path not in kept_blobs:
                _remove(f.blob_path)
    _drop_empty_revisions(ref.repo_id)
    return sorted(removed)


# -- internals -----------------------------------------------------------------------------

def _model_repos(repo_id: str | None = None) -> list:
    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        return []
    return [r for r in info.repos if r.repo_type == "model"
            and (repo_id is None or r.repo_id.lower() == repo_id.lower())]


def _revisions(repo_id: str) -> list:
    return [rev for repo in _model_repos(repo_id) for rev in repo.revisions]


def _files_by_path(rev) -> dict:
    """The revision's files (CachedFileInfo) by their path in the repo."""
    return {os.path.relpath(f.file_path, rev.snapshot_path).replace(os.sep, "/"): f
            for f in rev.files}


def _relative_files(rev) -> list[str]:
    return list(_files_by_path(rev))


def _name(repo_id: str, model: ModelFiles) -> str:
    return HubRef(repo_id, model.label or os.path.basename(model.files[0])).name


def _try_pick(models: list[ModelFiles], ref: HubRef) -> ModelFiles | None:
    try:
        return pick_model(models, ref.tag, ref.name)
    except HubError:  # not this one
        return None


def _pulled(repo_id: str, rev, model: ModelFiles, join: bool = True) -> PulledModel:
    files = _files_by_path(rev)
    mine = [files[f] for f in model.files]
    path = (model_path(repo_id, rev.commit_hash, model, str(rev.snapshot_path)) if join
            else os.path.join(str(rev.snapshot_path), model.files[0]))
    return PulledModel(_name(repo_id, model), path, sum(f.size_on_disk for f in mine),
                       max(f.blob_last_modified for f in mine), rev.commit_hash)


def _drop_empty_revisions(repo_id: str) -> None:
    """Revisions without files go through the hub's own delete (it drops their refs); a repo
    left with none is removed whole."""
    for repo in _model_repos(repo_id):
        empty = [r.commit_hash for r in repo.revisions if not r.files]
        if len(empty) == len(repo.revisions):
            shutil.rmtree(repo.repo_path, ignore_errors=True)
        elif empty:
            scan_cache_dir(cache_dir()).delete_revisions(*empty).execute()


def _remove(path) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
