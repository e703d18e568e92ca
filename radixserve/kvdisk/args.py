"""The disk tier's flags (``--kv-disk-cache DIR``, ``--kv-disk-cache-gb``,
``--no-kv-disk-cache``) and what they resolve to: on by default in ``serve``, under the
user's cache folder; off elsewhere unless a folder is given. Torch-free (the CLI's process)."""

from __future__ import annotations

import argparse
import os
import shutil

from radixserve.arg_types import positive

DEFAULT_MAX_GB = 10.0
DEFAULT_DISK_SHARE = 0.10  # of the disk's free space, when that is under DEFAULT_MAX_GB
GIB = 1024**3


def add_kv_disk_args(group) -> None:
    group.add_argument("--kv-disk-cache", default=None, metavar="DIR",
                       help="keep the prefix cache's pages evicted from the KV pool, and the "
                            "cached ones at shutdown, as files in DIR (one folder per model "
                            "fingerprint; checksummed; several servers may share DIR) and read "
                            "them back when a prompt's prefix is found there instead of "
                            "computing it again. serve default: the cache folder's kv/ "
                            "($RADIXSERVE_CACHE_DIR, else $XDG_CACHE_HOME/radixserve, else "
                            "~/.cache/radixserve); other commands: off")
    group.add_argument("--kv-disk-cache-gb", type=positive, default=None, metavar="GIB",
                       help="size budget of --kv-disk-cache, GiB, for every model in DIR "
                            "(least recently used pages go first). Default: 10 GiB or a "
                            "tenth of the disk's free space, whichever is smaller")
    group.add_argument("--no-kv-disk-cache", action="store_true",
                       help="no disk tier under the prefix cache")


def default_folder() -> str:
    """``kv/`` in radixserve's cache folder (tokenizer/backend_cache.py's rule)."""
    from radixserve.tokenizer.backend_cache import cache_dir

    return str(cache_dir() / "kv")


ENV = "RADIXSERVE_KV_DISK_CACHE"  # serve's default instead of the cache folder's kv/: a folder, or "off"


def kv_disk_kwargs(args: argparse.Namespace, is_serve: bool) -> dict:
    """``engine_config``'s ``kv_disk_cache`` and ``kv_disk_cache_gb`` from the flags; serve's
    default folder is ``$RADIXSERVE_KV_DISK_CACHE`` when set ("off": none; the test suite sets
    it so servers it starts share no pages), else `default_folder`."""
    if getattr(args, "no_kv_disk_cache", False):
        return {"kv_disk_cache": None}
    folder = getattr(args, "kv_disk_cache", None)
    if folder is None and is_serve:
        env = os.environ.get(ENV, "").strip()
        folder = None if env.lower() == "off" else env or default_folder()
    return {"kv_disk_cache": os.path.expanduser(folder) if folder else None,
            "kv_disk_cache_gb": getattr(args, "kv_disk_cache_gb", None)}


def default_budget_bytes(folder: str) -> int:
    """10 GiB, or a tenth of the free space of ``folder``'s disk, whichever is smaller."""
    free = shutil.disk_usage(folder).free
    return int(min(DEFAULT_MAX_GB * GIB, DEFAULT_DISK_SHARE * free))


def env_lines() -> list[str]:
    """``radixserve env``'s lines: serve's default folder, its budget and what it holds."""
    folder = default_folder()
    probe = folder if os.path.isdir(folder) else os.path.dirname(folder.rstrip("/")) or "."
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    held = num = 0
    for d, _, files in os.walk(folder):
        for f in files:
            if f.endswith(".kv"):
                num += 1
                try:
                    held += os.path.getsize(os.path.join(d, f))
                except FileNotFoundError:
                    pass
    return ["KV disk cache (serve; --kv-disk-cache, --no-kv-disk-cache):",
            (f"  folder: {folder}, budget {default_budget_bytes(probe) / GIB:.1f} GiB "
             f"(--kv-disk-cache-gb), holds {num} pages, {held / GIB:.2f} GiB")]
