"""The packed weights cache (models/packed_cache.py): a second load of a GGUF file reads every
matrix's packed bytes from the entry the first one wrote, in place on its mapping, and the model
computes exactly what a fresh pack computes; a changed file, a damaged entry and the budget are
handled; the server's engine writes the entry once idle and reads it on its next start."""

from __future__ import annotations

import json
import os

import pytest
import torch
from mapped_files import mapped_file
from tiny_models import hf_to_gguf, make_hf_model

from radixserve import LLM, SamplingParams
from radixserve.kernels import native
from radixserve.layers.block_linear import REPACK, BlockLinear
from radixserve.models import packed_cache
from radixserve.models.loader import load_model, load_model_config
from radixserve.models.packed_cache import PackedCache, packed_store
from radixserve.models.source import ModelSource

pytestmark = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A tiny Q4_K_M-like GGUF (K-quant and Q6_K layers, fused q/k/v and gate/up parts)."""
    root = tmp_path_factory.mktemp("packed")
    hf = make_hf_model("llama", root / "hf", hidden_size=256, intermediate_size=512,
                       head_dim=64)
    return hf_to_gguf(hf, root / "m.gguf", "Q4_K_M")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(packed_cache.ENV, raising=False)
    return tmp_path / "packed"


def _load(path, packs):
    source = ModelSource.resolve(str(path))
    config = load_model_config(source)
    return load_model(source, config, CPU, torch.float32, show_progress=False,
                      quantization="gguf", packs=packs)


def _packed(model) -> dict[str, torch.Tensor]:
    return {f"{name}.{b}": buf for name, m in model.named_modules()
            if isinstance(m, BlockLinear) for b, buf in m.named_buffers() if b.startswith("packed")}


def _outputs(model, ids=(1, 5, 9, 200, 17)) -> torch.Tensor:
    """Every layer taking the hidden width, on a few embedding rows: the kernels' reading of
    the packed bytes."""
    with torch.inference_mode():
        h = model.embed_tokens(torch.tensor(ids))
        return torch.cat([m(h) for m in model.modules()
                          if isinstance(m, BlockLinear) and m.in_features == h.shape[-1]], -1)


def test_a_second_load_reads_every_matrix_from_the_entry_in_place(gguf_file, cache_dir):
    first = packed_store(str(gguf_file))
    assert isinstance(first, PackedCache)
    fresh = _load(gguf_file, first)
    assert first.misses > 0 and first.hits == 0
    assert first.save()
    assert (cache_dir / f"{first.key}.bin").exists()

    second = packed_store(str(gguf_file))
    cached = _load(gguf_file, second)
    assert second.hits == first.misses and second.misses == 0
    a, b = _packed(fresh), _packed(cached)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(mapped_file(t.data_ptr()) == str(second.bin_path) for t in b.values())
    assert torch.equal(_outputs(fresh), _outputs(cached))  # the kernels read it as packed


def test_a_changed_file_is_a_new_entry_that_replaces_the_old(gguf_file, tmp_path, cache_dir):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(gguf_file.read_bytes())
    first = packed_store(str(copy))
    _load(copy, first)
    assert first.save()
    os.utime(copy, ns=(0, 12345))  # another modification time: maybe another file
    again = packed_store(str(copy))
    assert again.key != first.key
    _load(copy, again)
    assert again.hits == 0
    other = packed_store(str(gguf_file))  # another file's entry stays
    _load(gguf_file, other)
    assert other.save() and again.save()
    assert not first.bin_path.exists() and not first.index_path.exists()
    assert other.bin_path.exists()
    # rewritten in place within the clock's tick: same size, time and inode, other bytes
    stat = copy.stat()
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a sampled byte (32 evenly spaced samples)
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert copy.stat().st_ino == stat.st_ino
    assert packed_store(str(copy)).key != again.key


def test_a_damaged_entry_is_packed_again(gguf_file, cache_dir, caplog):
    first = packed_store(str(gguf_file))
    reference = _packed(_load(gguf_file, first))
    first.save()
    with open(first.bin_path, "r+b") as f:  # cut short: the index no longer describes it
        f.truncate(4096)
    damaged = packed_store(str(gguf_file))
    model = _load(gguf_file, damaged)
    assert damaged.hits == 0 and "unreadable" in caplog.text
    assert all(torch.equal(reference[k], t) for k, t in _packed(model).items())
    first.index_path.write_text("{not json")
    assert packed_store(str(gguf_file)).hits == 0


def test_an_entry_with_other_shapes_is_not_read(gguf_file, cache_dir):
    first = packed_store(str(gguf_file))
    _load(gguf_file, first)
    first.save()
    index = json.loads(first.index_path.read_text())
    name = next(iter(index["matrices"]))
    index["matrices"][name]["rows"] += 16
    first.index_path.write_text(json.dumps(index))
    again = packed_store(str(gguf_file))
    _load(gguf_file, again)
    assert again.misses == 1 and again.hits == first.misses - 1


def test_the_budget(gguf_file, tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv(packed_cache.ENV, "0")
    assert packed_store(str(gguf_file)) is REPACK
    monkeypatch.setenv(packed_cache.ENV, "lots")
    with pytest.raises(ValueError, match=packed_cache.ENV):
        packed_store(str(gguf_file))
    monkeypatch.setenv(packed_cache.ENV, str(1e-6))  # 1 KiB: nothing fits
    small = packed_store(str(gguf_file))
    _load(gguf_file, small)
    assert not small.save() and not small.bin_path.exists()
    # room is made by evicting the least recently used entry
    monkeypatch.delenv(packed_cache.ENV)
    other = tmp_path / "other.gguf"
    other.write_bytes(gguf_file.read_bytes())
    old = packed_store(str(other))
    _load(other, old)
    old.save()
    size = old.bin_path.stat().st_size
    monkeypatch.setenv(packed_cache.ENV, str(1.5 * size / (1 << 30)))
    new = packed_store(str(gguf_file))
    _load(gguf_file, new)
    assert new.save()
    assert new.bin_path.exists() and not old.bin_path.exists() and not old.index_path.exists()


def test_a_write_cut_short_leaves_nothing_read_and_its_file_is_removed(gguf_file, cache_dir):
    first = packed_store(str(gguf_file))
    _load(gguf_file, first)
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    orphan = cache_dir / f"{first.key}.bin.{dead}.tmp"
    mine = cache_dir / f"another.bin.{os.getpid()}.tmp"  # another load of this process
    cache_dir.mkdir(parents=True)
    orphan.write_bytes(b"partial")
    mine.write_bytes(b"partial")
    assert packed_store(str(gguf_file)).hits == 0  # no index: not an entry
    assert first.save()
    assert not orphan.exists() and mine.exists()  # a live writer's file is kept


def test_the_engine_writes_the_entry_once_idle_and_reads_it_next_start(gguf_file, cache_dir):
    prompt = [1, 5, 9, 200, 17, 33]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1)

    def run():
        llm = LLM(str(gguf_file), show_progress=False, num_kv_blocks=64)
        packs = llm.engine.runner.model.packs
        out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
        return llm, packs, out

    first_llm, first, a = run()  # LLM runs the engine's idle work at once
    for thread in [t for t in __import__("threading").enumerate()
                   if t.name == "radixserve-packed-save"]:
        thread.join(60)
    assert first.bin_path.exists() and first.misses > 0
    _, second, b = run()
    assert second.hits == first.misses and second.misses == 0
    assert a.token_ids == b.token_ids
    assert [lp for lp in a.logprobs] == [lp for lp in b.logprobs]
