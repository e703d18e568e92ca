"""benchmarks/make_quant_files.py and quant_load_check.py: the llama.cpp command lines they build
(against stand-in tools that log their arguments), the imatrix made once and only for the types
that take it, the tensor-type histogram, and the load check's table cells."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

BENCH = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import make_quant_files as mqf
import quant_load_check as qlc


def _gguf(path: Path) -> Path:
    """Two Q8_0 matrices and a float32 norm (gguf-py's own quantizer)."""
    w = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):
        q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                                  gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tools(tmp_path):
    """A bin folder whose llama-quantize / llama-imatrix log their arguments to calls.log;
    llama-quantize copies SRC to OUT, except for type BAD, which it refuses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    quantize = f"""#!/bin/sh
echo "llama-quantize $*" >> {log}
n=$#  # ... SRC OUT TYPE THREADS
eval "type=\\${{$((n-1))}}"; eval "out=\\${{$((n-2))}}"; eval "src=\\${{$((n-3))}}"
if [ "$type" = BAD ]; then echo "invalid type BAD"; exit 1; fi
cp "$src" "$out"
"""
    imatrix = f"""#!/bin/sh
echo "llama-imatrix $*" >> {log}
while [ $# -gt 0 ]; do [ "$1" = -o ] && touch "$2"; shift; done
"""
    for name, text in (("llama-quantize", quantize), ("llama-imatrix", imatrix)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


def test_histogram_counts_tensors_and_bytes_per_type(tmp_path):
    path = _gguf(tmp_path / "m.gguf")
    assert mqf.histogram(path) == [("Q8_0", 2, 2 * 4 * 68), ("F32", 1, 256)]
    assert mqf.describe(path).startswith("| m.gguf | 0 | Q8_0 68% (2), F32 32% (1) |")


def test_quantize_passes_the_imatrix_and_a_variants_flags(tools, tmp_path):
    bin_dir, log = tools
    src = _gguf(tmp_path / "src.gguf")
    im = tmp_path / "im.gguf"
    assert mqf.quantize(bin_dir, src, tmp_path / "a.gguf", "IQ2_XS", im, 2)
    assert mqf.quantize(bin_dir, src, tmp_path / "b.gguf", "MXFP4_FFN", None, 2)
    first, second = log.read_text().splitlines()
    assert first == (f"llama-quantize --allow-requantize --imatrix {im} {src} "
                     f"{tmp_path / 'a.gguf'} IQ2_XS 2")
    assert second == ("llama-quantize --allow-requantize --tensor-type ffn_up=mxfp4 "
                      "--tensor-type ffn_gate=mxfp4 --tensor-type ffn_down=mxfp4 "
                      f"{src} {tmp_path / 'b.gguf'} MXFP4_MOE 2")


def test_a_refused_type_leaves_no_file_and_says_why(tools, tmp_path, capsys):
    bin_dir, _ = tools
    out = tmp_path / "bad.gguf"
    out.write_bytes(b"half written")
    assert not mqf.quantize(bin_dir, _gguf(tmp_path / "src.gguf"), out, "BAD", None, 1)
    assert not out.exists() and "invalid type BAD" in capsys.readouterr().out


def _main(bin_dir: Path, src: Path, out_dir: Path, types: str) -> str:
    text = out_dir.parent / "any.txt"
    text.write_text("any text will do\n")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "make_quant_files.py"), "--src", str(src), "--out-dir",
         str(out_dir), "--types", types, "--llama-bin", str(bin_dir), "--threads", "1",
         "--imatrix-text", str(text)],
        check=True, capture_output=True, text=True)
    return proc.stdout


def test_the_imatrix_is_made_once_and_only_for_the_types_that_take_it(tools, tmp_path):
    bin_dir, log = tools
    src = _gguf(tmp_path / "src.gguf")
    out_dir = tmp_path / "quant"
    text = _main(bin_dir, src, out_dir, "Q2_K,BAD")
    assert "llama-imatrix" not in log.read_text()
    assert "| src-Q2_K.gguf | 0 | Q8_0 68% (2), F32 32% (1) |" in text
    assert "refused by llama-quantize: BAD" in text
    _main(bin_dir, src, out_dir, "Q2_K,IQ1_S,IQ3_XXS")  # Q2_K is there already: kept
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["llama-quantize", "llama-quantize", "llama-imatrix",
                                             "llama-quantize", "llama-quantize"]
    assert "-c 512 --chunks 24" in calls[2] and "--no-repack" in calls[2]
    assert all(f"--imatrix {out_dir / 'imatrix-src.gguf'}" in c for c in calls[3:])


def test_load_check_cells():
    assert qlc.common_prefix("def f(n):\n  a", "def f(n):\n  b") == "12"
    assert qlc.common_prefix("same", "same") == "same"
    assert qlc.common_prefix(None, "x") == "-"
    assert qlc.shown("a|b\nc`", "") == "`a\\|b⏎c'`"
    assert qlc.shown(None, "unsupported GGUF tensor type X") == (
        "**error:** `unsupported GGUF tensor type X`")


def test_a_missing_tool_names_the_folder(tmp_path):
    with pytest.raises(SystemExit, match="no llama-quantize in"):
        mqf.tool(tmp_path, "llama-quantize")


def test_llama_completions_text_is_read_as_printed(tmp_path):
    """llama-completion prints the text then two newlines (" [end of text]" first on EOS); a
    crash is named by its signal."""
    exe = tmp_path / "llama-completion"
    exe.write_text('#!/bin/sh\ncase "$2" in\n  eos.gguf) printf "x = 1\\n [end of text]\\n\\n";;\n'
                   '  crash.gguf) echo "loading" >&2; kill -SEGV $$;;\n'
                   '  *) printf "def f():\\n  return\\n\\n";;\nesac\n')
    exe.chmod(0o755)
    args = ("p", 24, 1, 30.0, ["--no-repack"])
    assert qlc.llama(tmp_path, Path("a.gguf"), *args)[0] == "def f():\n  return"
    assert qlc.llama(tmp_path, Path("eos.gguf"), *args)[0] == "x = 1\n"
    text, err, _ = qlc.llama(tmp_path, Path("crash.gguf"), *args)
    assert text is None and err == "killed by SIGSEGV: loading"
