"""``radixserve generate``'s sampling defaults: explicit flags, then the GGUF's recommended
``general.sampling.*``, then the command's own; and the first-run demo without a prompt."""

from __future__ import annotations

import argparse
import subprocess
import sys

import gguf
import pytest

from radixserve.cli_args import add_sampling_args, sampling_params
from radixserve.recommended_sampling import recommended_sampling


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sampling_args(parser, temperature=0.0, max_tokens=64)
    return parser.parse_args(argv)


def test_recommended_sampling_reads_the_gguf_keys(tmp_path):
    path = tmp_path / "rec.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_sampling_temp(0.6)
    writer.add_sampling_top_k(20)
    writer.add_sampling_top_p(0.95)
    writer.add_sampling_penalty_repeat(1.05)
    writer.add_sampling_penalty_last_n(64)  # no counterpart: ignored
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    rec = recommended_sampling(str(path))
    assert rec == pytest.approx({"temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                 "repetition_penalty": 1.05})
    assert isinstance(rec["top_k"], int)
    assert recommended_sampling(None) == {}  # the embedded GGUF carries none
    assert recommended_sampling(str(tmp_path / "missing.gguf")) == {}  # the load says so


def test_flags_beat_the_recommendation_which_beats_the_defaults():
    rec = {"temperature": 0.6, "top_k": 20, "repetition_penalty": 1.05}
    p = sampling_params(_parse(), rec)
    assert (p.temperature, p.top_k, p.top_p, p.repetition_penalty, p.max_tokens) == \
        (0.6, 20, 1.0, 1.05, 64)
    p = sampling_params(_parse("--temperature", "0", "--top-k", "-1", "--max-tokens", "5"), rec)
    assert (p.temperature, p.top_k, p.repetition_penalty, p.max_tokens) == (0.0, -1, 1.05, 5)
    p = sampling_params(_parse())
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == \
        (0.0, -1, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        sampling_params(_parse("--temperature", "-1"), rec)


@pytest.mark.slow
def test_generate_without_a_prompt_is_the_chat_demo():
    r = subprocess.run([sys.executable, "-m", "radixserve", "generate", "--max-tokens", "48"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "no prompt given, so a demo" in r.stderr
    assert ">>> Explain in a few sentences why the sky is blue." in r.stderr
    text = r.stdout.lower()
    assert "scatter" in text or "blue" in text, r.stdout  # an answer, not a continuation
