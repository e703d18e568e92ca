"""A GGUF whose counts lie fails fast with ValueError (issue 62 item 4): every count is checked
against the bytes left in the file before anything loops over it. Before the fix, a string
array declaring 2^62 items looped without bound, taking memory until the machine ran out, so
each file is read in a child process with a time and memory limit: a regression fails here
instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hostile_gguf import ALL, huge_string_array

from radixserve.gguf_reader import open_gguf

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from radixserve.gguf_reader import open_gguf
start = time.monotonic()
try:
    open_gguf(sys.argv[1])
except ValueError as exc:
    print(f"{time.monotonic() - start:.3f} {exc}")
else:
    print("read without error")
"""


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_lying_count_is_a_quick_value_error(tmp_path, name):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(ALL[name]())
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=False,
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PYTHONPATH": _REPO})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: the reader ran 30 s without answering")
    seconds, _, message = out.stdout.strip().partition(" ")
    assert "not a valid GGUF" in message, (out.stdout, out.stderr[-2000:])
    assert float(seconds) < 1.0, message


def test_the_error_says_which_count_does_not_fit(tmp_path):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(huge_string_array(10_000))
    with pytest.raises(ValueError, match=r"10000 .* bytes left"):
        open_gguf(str(path))


def test_an_honest_small_file_still_reads(tmp_path):
    path = tmp_path / "small.gguf"
    path.write_bytes(huge_string_array(3))
    fields = open_gguf(str(path)).fields
    assert fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
    assert fields["general.architecture"].contents() == "llama"
