"""``open_gguf``'s fast reader gives what gguf's ``GGUFReader`` gives, and keeps the mapping the
loader hands pages back through."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from real_models import gemma3_270m, gguf_reader

from radixserve.gguf_reader import open_gguf
from radixserve.models.default import default_model_path


@pytest.mark.parametrize("which", ["embedded", "gemma3-270m"])
def test_fields_and_tensors_are_gguf_readers(which):
    path = str(default_model_path()) if which == "embedded" else gemma3_270m()
    fast, ref = open_gguf(path), gguf_reader(path)
    assert list(fast.fields) == list(ref.fields)
    for name, field in fast.fields.items():
        other = ref.fields[name]
        assert field.types == other.types and field.data == other.data, name
        assert field.offset == other.offset, name
        assert [p.tobytes() for p in field.parts] == [p.tobytes() for p in other.parts], name
        assert field.contents() == other.contents(), name
    assert len(fast.tensors) == len(ref.tensors)
    for a, b in zip(fast.tensors, ref.tensors):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (
            b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert np.array_equal(a.data, b.data)


def test_the_mapping_stays_reachable_for_madvise():
    reader = open_gguf(str(default_model_path()))
    assert isinstance(reader.mapped._mmap, mmap.mmap)  # gguf_stored._Pages releases through it


def test_not_a_gguf_is_a_value_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a valid GGUF"):
        open_gguf(str(bad))
