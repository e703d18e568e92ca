"""lm-evaluation-harness against the server, end to end: ``lm_eval --model local-completions``
runs a multiple-choice and a perplexity task (written here, with local data) through
/v1/completions (echo + logprobs, scored in the prefill), and its numbers equal those of
lm-eval's own transformers backend (``--model hf``) on the same weights, to 1e-3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_proc import ServerProc

MC = [
    {"question": "The sky on a clear day is", "choices": [" blue", " green", " loud"],
     "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven", " a cat"], "answer": 0},
    {"question": "Fish live in", "choices": [" trees", " water", " deserts"], "answer": 1},
    {"question": "The opposite of hot is", "choices": [" warm", " red", " cold"], "answer": 2},
]
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was a sunny afternoon in the park.",
    "Rivers flow to the sea; the sea is salt, and the rain comes back to the hills again.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
]
MC_TASK = """\
task: rs_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""
PPL_TASK = """\
task: rs_perplexity
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""
METRICS = {"rs_choice": ("acc,none", "acc_norm,none"),
           "rs_perplexity": ("word_perplexity,none", "byte_perplexity,none",
                             "bits_per_byte,none")}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, rows, template in (("choice", MC, MC_TASK),
                                 ("perplexity", [{"text": t} for t in TEXTS], PPL_TASK)):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"rs_{name}.yaml").write_text(template.format(data=data))
    return root


def lm_eval(tasks: Path, out: Path, model: str, model_args: str) -> dict:
    """Run the ``lm_eval`` CLI offline; its results by task."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(out / "hf_home"), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", "rs_choice", "rs_perplexity", "--include_path", str(tasks),
           "--output_path", str(out), "--seed", "0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (result,) = out.rglob("results_*.json")
    return json.loads(result.read_text())["results"]


def test_local_completions_equal_transformers(tiny_hf_dirs, tasks, tmp_path):
    folder = tiny_hf_dirs["llama"]
    server = ServerProc("--model", str(folder), "--served-model-name", "tiny")
    try:
        ours = lm_eval(tasks, tmp_path / "ours", "local-completions",
                       f"model=tiny,base_url={server.url}/v1/completions,tokenizer={folder},"
                       "tokenized_requests=True,num_concurrent=2,max_retries=1")
    finally:
        assert server.stop() == 0
    reference = lm_eval(tasks, tmp_path / "hf", "hf", f"pretrained={folder},dtype=float32")
    for task, metrics in METRICS.items():
        for metric in metrics:
            got, want = ours[task][metric], reference[task][metric]
            assert got == pytest.approx(want, rel=1e-3, abs=1e-3), (task, metric, got, want)
