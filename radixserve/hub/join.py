"""Join the parts of a split GGUF (llama.cpp ``gguf-split``: NAME-00001-of-0000N.gguf) into
one file, once, so every reader of a model (the loader, the tensor-parallel shards, the API
process's tokenizer and metadata) keeps reading one path.

Each part is a GGUF of its own: the first holds every metadata key plus ``split.no``,
``split.count`` and ``split.tensors.count``; each holds the tensor infos and data of its
tensors. The joined file is the first part's metadata without the ``split.*`` keys, then
every part's tensors in order, written with gguf's own writer (the file llama.cpp's
``gguf-split --merge`` writes)."""

from __future__ import annotations

import os

import gguf

from radixserve.gguf_reader import open_gguf
from radixserve.hub.errors import HubError

_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def join_split_gguf(parts: list[str], dest: str) -> None:
    """Write the model split over ``parts`` (in order) to ``dest``, through a temporary file
    renamed into place (an interrupted join leaves no ``dest``). HubError when the parts do
    not make one model (a part missing, out of order, or a tensor count that disagrees)."""
    readers = [open_gguf(p) for p in parts]
    _check_parts(readers, parts)
    first = readers[0]
    arch = str(first.fields["general.architecture"].contents())
    tmp = f"{dest}.{os.getpid()}.joining"
    writer = gguf.GGUFWriter(tmp, arch)
    alignment = first.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    try:
        for field in first.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF.") \
                    or field.name in _SPLIT_KEYS:
                continue  # the writer adds these itself, or they describe the split
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        for reader in readers:
            for t in reader.tensors:
                writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes,
                                       t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for reader in readers:
            for t in reader.tensors:
                writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dest)
    finally:
        writer.close()
        if os.path.exists(tmp):
            os.remove(tmp)


def _check_parts(readers, parts: list[str]) -> None:
    def value(reader, key):
        field = reader.fields.get(key)
        return None if field is None else int(field.contents())

    count = value(readers[0], "split.count")
    if count != len(parts):
        raise HubError(f"{parts[0]} says the model has {count} parts, found {len(parts)}")
    for i, (reader, path) in enumerate(zip(readers, parts)):
        if value(reader, "split.no") != i:
            raise HubError(f"{path} is part {value(reader, 'split.no')}, expected part {i}")
    total = value(readers[0], "split.tensors.count")
    found = sum(len(r.tensors) for r in readers)
    if total is not None and total != found:
        raise HubError(f"{parts[0]} says the model has {total} tensors, its parts hold {found}")
