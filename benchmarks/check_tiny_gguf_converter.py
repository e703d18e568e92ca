"""Check tests/tiny_hybrid.py's GGUF writer against llama.cpp's own converter.

CI has no llama.cpp source, so the tests convert the tiny Qwen3.5 checkpoints with
``qwen35_hf_to_gguf``; this script says whether that writer still writes what
``convert_hf_to_gguf.py`` writes. For each case (plain, tied, a ConditionalGeneration folder
with an MTP block; the MoE model (``qwen35moe``) with fused 3-D or per-expert tensors, as a
ConditionalGeneration folder, with ``--fuse-gate-up-exps``; F32, F16, Q8_0) it builds the tiny
folder, converts it both ways and compares
every metadata key (value and type) and every tensor (name, type, shape, bytes). The ``general.*``
keys the converter derives from the folder name and model card (name, basename, size label)
are listed apart: they name the file, they do not describe the model.

    python benchmarks/check_tiny_gguf_converter.py [--llama-cpp DIR]

``DIR`` (default: ``$LLAMA_CPP_SOURCE``, else /work/peers/llama.cpp) is a llama.cpp checkout;
the converter runs with this interpreter and the checkout's own gguf-py. The tiny tokenizer's
pre-tokenizer is Qwen2's, which the converter cannot recognize by hash, so its
``get_vocab_base_pre`` is told "qwen2" (what the writer says). Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_hybrid import make_qwen35_hf_model, make_qwen35_moe_hf_model, qwen35_hf_to_gguf

# runs the converter as __main__, its gguf-py first on the path, the pre-tokenizer named
WRAPPER = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
_NAMING_KEYS = ("general.name", "general.basename", "general.size_label", "general.finetune",
                "general.version", "general.license", "general.tags", "general.languages")
DENSE, MOE = make_qwen35_hf_model, make_qwen35_moe_hf_model
CASES = (  # (label, maker, its keywords, ftype, --fuse-gate-up-exps)
    ("plain", DENSE, {}, "F32", False),
    ("plain", DENSE, {}, "F16", False),
    ("tied", DENSE, {"tie_word_embeddings": True}, "Q8_0", False),
    ("conditional-mtp", DENSE, {"conditional": True, "mtp": True}, "F32", False),
    ("conditional-mtp", DENSE, {"conditional": True, "mtp": True}, "Q8_0", False),
    ("moe-fused", MOE, {}, "F32", False),
    ("moe-fused", MOE, {}, "Q8_0", False),
    ("moe-fused", MOE, {}, "F16", True),
    ("moe-per-expert", MOE, {"fused": False}, "F32", False),
    ("moe-conditional", MOE, {"conditional": True}, "Q8_0", False),
    ("moe-mtp", MOE, {"mtp": True}, "Q8_0", False),
)


def convert(wrapper: str, llama_cpp: Path, hf_dir: Path, out: Path, ftype: str,
            *extra: str) -> None:
    """convert_hf_to_gguf.py of the ``llama_cpp`` checkout on ``hf_dir`` through ``wrapper``
    (``WRAPPER`` or a family's variant of it), its ``extra`` flags after ``--outtype``."""
    args = [sys.executable, "-c", wrapper, str(llama_cpp), str(hf_dir), "--outfile", str(out),
            "--outtype", ftype.lower(), *extra]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")


def run_converter(llama_cpp: Path, hf_dir: Path, out: Path, ftype: str, mtp: bool,
                  fuse_gate_up: bool = False) -> None:
    """The Qwen3.5 / Qwen3-Next conversion: ``--no-mtp`` unless ``mtp``."""
    convert(WRAPPER, llama_cpp, hf_dir, out, ftype, *([] if mtp else ["--no-mtp"]),
            *(["--fuse-gate-up-exps"] if fuse_gate_up else []))


@dataclass(frozen=True)
class Case:
    """One comparison: the folder ``folder`` (made by ``make(path)`` once, shared by the cases
    naming it) converted by ``convert(llama_cpp, folder, out)`` and by the test writer
    ``write(folder, out)``."""

    name: str
    folder: str
    make: Callable[[Path], object]
    convert: Callable[[Path, Path, Path], None]
    write: Callable[[Path, Path], object]


def check_cases(doc: str, prefix: str, cases: Iterable[Case]) -> int:
    """A check script's main: ``--llama-cpp DIR`` (default ``$LLAMA_CPP_SOURCE``, else
    /work/peers/llama.cpp), each case compared and printed; exit status 0 when every case is
    equal but for the naming keys, 1 on a difference, 2 without the converter."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=Path(
        os.environ.get("LLAMA_CPP_SOURCE", "/work/peers/llama.cpp")))
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        print(f"no convert_hf_to_gguf.py in {args.llama_cpp}", file=sys.stderr)
        return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        for case in cases:
            hf_dir = root / case.folder
            if not (hf_dir / "config.json").exists():
                case.make(hf_dir)
            ref, mine = root / f"{case.name}-ref.gguf", root / f"{case.name}.gguf"
            case.convert(args.llama_cpp, hf_dir, ref)
            case.write(hf_dir, mine)
            problems, notes = compare(ref, mine)
            print(f"{case.name}: {'OK' if not problems else f'{len(problems)} differences'}"
                  f" ({len(notes)} naming keys differ)")
            for line in problems + [f"  (naming) {n}" for n in notes]:
                print(f"  {line}")
            failed |= bool(problems)
    return 1 if failed else 0


def _fields(reader) -> dict[str, tuple[str, object]]:
    """key → (GGUF value type names, value) of every metadata key but the header's."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        kinds = "/".join(t.name for t in field.types)
        value = field.contents()
        out[key] = (kinds, value)
    return out


def compare(ref_path: Path, mine_path: Path) -> tuple[list[str], list[str]]:
    """(differences, naming notes) between the converter's file and the writer's."""
    from gguf import GGUFReader

    ref, mine = GGUFReader(str(ref_path)), GGUFReader(str(mine_path))
    problems, notes = [], []
    ref_fields, mine_fields = _fields(ref), _fields(mine)
    for key in sorted(set(ref_fields) | set(mine_fields)):
        a, b = ref_fields.get(key), mine_fields.get(key)
        if a == b:
            continue
        line = f"key {key}: converter {a!r:.120} / writer {b!r:.120}"
        (notes if key in _NAMING_KEYS else problems).append(line)
    ref_tensors = {t.name: t for t in ref.tensors}
    mine_tensors = {t.name: t for t in mine.tensors}
    for name in sorted(set(ref_tensors) ^ set(mine_tensors)):
        problems.append(f"tensor {name}: only in the "
                        f"{'converter' if name in ref_tensors else 'writer'}'s file")
    for name in sorted(set(ref_tensors) & set(mine_tensors)):
        a, b = ref_tensors[name], mine_tensors[name]
        shape_a, shape_b = list(map(int, a.shape)), list(map(int, b.shape))
        if a.tensor_type != b.tensor_type or shape_a != shape_b:
            problems.append(f"tensor {name}: converter {a.tensor_type.name} {shape_a} / "
                            f"writer {b.tensor_type.name} {shape_b}")
        elif not np.array_equal(np.asarray(a.data).view(np.uint8),
                                np.asarray(b.data).view(np.uint8)):
            problems.append(f"tensor {name}: the bytes differ")
    return problems, notes


def main() -> int:
    return check_cases(__doc__, "tiny-qwen35-", [
        Case(f"{label}-{ftype}{'-fuse-gate-up' if fuse else ''}", label,
             partial(maker, seed=0, **kwargs),
             partial(_convert, ftype=ftype, mtp=kwargs.get("mtp", False), fuse=fuse),
             partial(_write, ftype=ftype, fuse=fuse))
        for label, maker, kwargs, ftype, fuse in CASES])


def _convert(llama_cpp: Path, hf_dir: Path, out: Path, *, ftype: str, mtp: bool,
             fuse: bool) -> None:
    run_converter(llama_cpp, hf_dir, out, ftype, mtp, fuse)


def _write(hf_dir: Path, out: Path, *, ftype: str, fuse: bool) -> None:
    qwen35_hf_to_gguf(hf_dir, out, ftype, fuse)


if __name__ == "__main__":
    sys.exit(main())
