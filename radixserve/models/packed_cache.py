"""A GGUF file's matrices in the kernels' packed layout, kept on disk between starts.

Loading a GGUF as stored repacks every block-quantized matrix into the layout the kernels read
(layers/block_linear.py ``pack``): about 0.45 s for a 1.5B Q4_K_M file on two cores, seconds
for a 30B one, on every start. The packed bytes depend only on the file and on the code that
packs them, so the first start writes them to one file, and later starts map that file and
read each matrix's packed bytes in place (the file's pages, like llama.cpp's mapped weights:
shared with the page cache, read in as the kernels touch them).

An entry is two files in ``<cache folder>/packed/`` named by a key: a hash of the GGUF file's
identity (path, size, modification time, inode) and of 33 samples of its bytes (4 KiB each,
evenly spaced), the tensor-parallel shard, the kernel library that packs (each CPU level's own
file) and the Python code that packs (``layers/block_linear.py``). Any change to one is a
new entry, never a stale one. ``<key>.bin`` holds the packed matrices, each at a 4 KiB
boundary; ``<key>.json`` lists them by the GGUF tensors each was packed from (name, type,
rows, columns, offset, bytes). A matrix the index does not list, or lists with another shape,
is packed as before. The index is written last, after the data is synced, so an entry whose
write was cut short has no index and is never read.

The write waits until the engine has been idle (``EngineCore.idle``), on a thread of its own
at background priority. The folder is held to a budget, ``RADIXSERVE_PACKED_CACHE_GB`` (default
the smaller of 64 GiB and half the disk's free space; 0 turns the cache off): the least
recently used entries go first, and an entry that does not fit is not written. Writing a
file's entry removes its older ones (from before the file, the code or the kernel level
changed): one entry per file at a time. A folder that cannot be written (a read-only home)
only makes every start pack again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import mmap
import os
import shutil
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from radixserve.cpu.threads import background_priority
from radixserve.kernels import native
from radixserve.layers import block_linear
from radixserve.layers.block_linear import REPACK, Repack
from radixserve.models.tp_shard import TensorShard
from radixserve.tokenizer.backend_cache import cache_dir

logger = logging.getLogger(__name__)

ENV = "RADIXSERVE_PACKED_CACHE_GB"
DEFAULT_BUDGET = 64 << 30
ALIGN = 4096
VERSION = 1


def packed_store(path: str, shard: TensorShard = TensorShard()) -> Repack:
    """The store for loading the GGUF file at ``path`` as ``shard``: a `PackedCache` (its
    entry opened if there is one), or `REPACK` where the cache is off, the kernels do not
    load or the file cannot be keyed."""
    budget = _budget()
    if budget == 0 or native.load() is None:
        return REPACK
    try:
        key = _key(path, shard)
    except OSError:
        return REPACK
    return PackedCache(cache_dir() / "packed", key, budget, os.path.realpath(path))


class PackedCache(Repack):
    """One GGUF file's packed matrices on disk (see the module docstring). Not thread-safe
    while loading (the loader's thread); ``save_when_idle`` hands the work to a thread."""

    def __init__(self, folder: Path, key: str, budget: int | None, source: str = "") -> None:
        """``source``: the GGUF file's resolved path (its other entries, from an older file
        or older code, are removed when this one is written)."""
        self.folder, self.key, self.budget, self.source = folder, key, budget, source
        self._index: dict[str, dict] = {}
        self._map: mmap.mmap | None = None
        self._kept: dict[str, tuple[dict, torch.Tensor]] = {}  # name -> (entry, bytes)
        self.hits = self.misses = 0
        self._open()

    @property
    def bin_path(self) -> Path:
        return self.folder / f"{self.key}.bin"

    @property
    def index_path(self) -> Path:
        return self.folder / f"{self.key}.json"

    def _open(self) -> None:
        try:
            index = json.loads(self.index_path.read_text())
            with open(self.bin_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if (index.get("version") != VERSION or size != index.get("bytes")
                        or size == 0):
                    raise ValueError("the index does not describe the data file")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if not all(isinstance(e, dict) and isinstance(e.get("offset"), int)
                       for e in index["matrices"].values()):
                raise ValueError("malformed matrices")
            self._index = index["matrices"]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("packed weights cache entry %s unreadable (%s); packing again",
                           self.index_path, exc)
            return
        try:
            os.utime(self.index_path)  # recently used: evicted last
        except OSError:  # a read-only folder: read, never evicted by this process
            pass

    def loaded(self) -> str:
        if not self.hits + self.misses:
            return ""
        if self.misses:
            return (f"packed weights: {self.hits} of {self.hits + self.misses} matrices read "
                    f"from the cache, the rest packed (the entry {self.bin_path} is written "
                    "once the engine is idle)")
        return (f"packed weights: all {self.hits} matrices read from the cache "
                f"({self.bin_path})")

    def packed(self, name: str, qtype, raws: Sequence[torch.Tensor], k: int) -> torch.Tensor:
        n = sum(int(r.shape[0]) for r in raws)
        want = {"type": int(qtype), "rows": n, "k": int(k),
                "bytes": block_linear.packed_bytes(qtype, n, k)}
        entry = self._index.get(name)
        if (self._map is not None and entry is not None
                and all(entry.get(f) == v for f, v in want.items())
                and entry["offset"] + entry["bytes"] <= len(self._map)):
            self.hits += 1
            out = _view(self._map, entry["offset"], entry["bytes"])
        else:
            self.misses += 1
            out = block_linear.pack(qtype, raws, k)
        self._kept[name] = (want, out)
        return out

    def save_when_idle(self) -> None:
        """Write the entry (on a background thread) if this load packed anything itself."""
        if not self.misses:
            return
        threading.Thread(target=self._save, name="radixserve-packed-save", daemon=True).start()

    def _save(self) -> None:
        background_priority()
        try:
            self.save()
        except OSError as exc:
            logger.warning("packed weights cache not written (%s): each start packs the "
                           "weights again", exc)

    def save(self) -> bool:
        """Write the entry now (False where it does not fit the budget). OSError if the
        folder cannot be written."""
        layout, end = {}, 0
        for name, (entry, _) in self._kept.items():
            layout[name] = {**entry, "offset": end}
            end += -(-entry["bytes"] // ALIGN) * ALIGN
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._make_room(end):
            logger.info("packed weights cache: %.1f GiB do not fit its budget (%s); each "
                        "start packs the weights again", end / (1 << 30), ENV)
            return False
        tmp = self.bin_path.with_name(f"{self.bin_path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                for name, (entry, data) in self._kept.items():
                    f.seek(layout[name]["offset"])
                    f.write(memoryview(data.numpy()))
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.bin_path)
            index_tmp = self.index_path.with_name(f"{self.index_path.name}.{os.getpid()}.tmp")
            index_tmp.write_text(json.dumps({"version": VERSION, "bytes": end,
                                             "source": self.source, "matrices": layout}))
            os.replace(index_tmp, self.index_path)
        finally:
            tmp.unlink(missing_ok=True)
        logger.info("packed weights cache: wrote %.2f GiB to %s", end / (1 << 30),
                    self.bin_path)
        return True

    def _make_room(self, size: int) -> bool:
        """Evict the least recently used other entries until ``size`` more bytes fit the
        budget; False where they cannot."""
        _remove_orphans(self.folder)
        budget = self.budget if self.budget is not None else min(
            DEFAULT_BUDGET, shutil.disk_usage(self.folder).free // 2)
        entries = sorted((p for p in self.folder.glob("*.json") if p.stem != self.key),
                         key=lambda p: p.stat().st_mtime)
        for stale in [p for p in entries if self.source and _source(p) == self.source]:
            entries.remove(stale)  # this file's entry from before (the file or the code changed)
            _remove(stale)
        used = sum(_entry_bytes(p) for p in entries)
        while entries and used + size > budget:
            oldest = entries.pop(0)
            used -= _entry_bytes(oldest)
            _remove(oldest)
        return used + size <= budget


def _remove(index: Path) -> None:
    index.unlink(missing_ok=True)  # the index first: the entry is gone from then on
    index.with_suffix(".bin").unlink(missing_ok=True)


def _source(index: Path) -> str | None:
    """The GGUF file an entry was packed from (None if its index cannot be read)."""
    try:
        return json.loads(index.read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None


def _budget_text() -> str:
    budget = _budget()
    return (f"budget {budget / (1 << 30):g} GiB, {ENV}" if budget is not None
            else f"budget the smaller of 64 GiB and half the free disk; {ENV} sets it")


def cache_line() -> str:
    """``radixserve env``'s line: where the cache is and its budget, or that it is off."""
    try:
        budget = _budget()
    except ValueError as exc:
        return f"  packed weights cache: {exc}"
    if budget == 0:
        return f"  packed weights cache: off ({ENV}=0): every start packs the weights"
    return f"  packed weights cache: {cache_dir() / 'packed'} ({_budget_text()})"


def _remove_orphans(folder: Path) -> None:
    """Delete the partial files of writes whose process is gone (one stopped mid-write)."""
    for tmp in folder.glob("*.tmp"):
        try:
            pid = int(tmp.suffixes[-2].lstrip("."))
            os.kill(pid, 0)  # alive (maybe writing): keep
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, IndexError, OSError):
            continue


def _entry_bytes(index: Path) -> int:
    try:
        return index.with_suffix(".bin").stat().st_size
    except OSError:
        return 0


def _view(mapped: mmap.mmap, offset: int, size: int) -> torch.Tensor:
    """``size`` bytes of the read-only mapping at ``offset`` as a uint8 tensor (no copy; the
    kernels only read packed weights)."""
    array = np.frombuffer(mapped, dtype=np.uint8, count=size, offset=offset)
    with warnings.catch_warnings():  # not writable: nothing writes packed weights
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _budget() -> int | None:
    """The folder's budget in bytes from ``RADIXSERVE_PACKED_CACHE_GB`` (None: the default,
    decided at write time; 0: off). ValueError for a value that is not a number >= 0."""
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return None
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise ValueError(f"{ENV} must be a number of GiB >= 0 (0 turns the cache off), "
                         f"got {raw!r}")
    return int(gb * (1 << 30))


SAMPLES, SAMPLE_BYTES = 32, 4096


def _key(path: str, shard: TensorShard) -> str:
    """The entry's key (see the module docstring). OSError if the file cannot be read."""
    key = hashlib.sha256()
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        for part in (VERSION, os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino,
                     shard.rank, shard.size, inspect.getsource(block_linear)):
            key.update(repr(part).encode())
        # and samples of the bytes: a file rewritten within the clock's tick (same size and
        # modification time) is another entry as well
        for i in range(SAMPLES + 1):
            f.seek(min(i * st.st_size // SAMPLES, max(st.st_size - SAMPLE_BYTES, 0)))
            key.update(f.read(SAMPLE_BYTES))
    library = native.describe().path
    if library is not None:
        key.update(Path(library).read_bytes())
    return key.hexdigest()
