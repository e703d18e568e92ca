"""Gemma 2 and Gemma 3 on the native layer stack (one decoder_layer.cpp call per layer: four
norms, q/k norms, GeGLU, soft-capped scores, sliding and global layers with their own rope
tables): the same bits as the Python Gemma layers calling the same kernels, at each CPU level,
through chunked prefill across the window's edge and mixed decode steps; and a sequence's
logits do not depend on the batch it runs in."""

from __future__ import annotations

import logging

import pytest
import torch
from test_windowed_models import Paged, prompts, runner_for
from tiny_models import hf_to_gguf, make_hf_model

from radixserve.kernels import native
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack

pytestmark = [pytest.mark.skipif(native.load() is None, reason="native kernels unavailable"),
              pytest.mark.usefixtures("kernel_level")]  # each level this CPU runs

# Windows of 8 tokens, blocks of 4: chunks that start before the window's edge and end past
# it, one-token decodes, at different paces per sequence.
_PLAN = ([(0, 9), (1, 5)], [(0, 6), (1, 1)], [(0, 1), (1, 9)], [(0, 1), (1, 1)])
_LENGTHS = (17, 16)


@pytest.fixture(scope="module")
def gemma_files(tmp_path_factory):
    """(arch, GGUF type) -> a tiny random Gemma's GGUF file, made on first use."""
    root, made = tmp_path_factory.mktemp("gemma_native"), {}

    def get(arch: str, ftype: str):
        if (arch, ftype) not in made:
            hf = root / arch / "hf"
            if not hf.exists():
                make_hf_model(arch, hf, seed=5)
            made[arch, ftype] = hf_to_gguf(hf, root / arch / f"{ftype}.gguf", ftype)
        return made[arch, ftype]

    return get


def _run(runner, tokens, seqs=(0, 1)):
    """Each step's logits of the sequences in ``seqs``, the plan's chunks in order."""
    paged, out = Paged(tokens, 4, seed=2), []
    for step in _PLAN:
        chunks = [(i, n) for i, n in step if i in seqs]
        out += runner.all_logits([paged.chunk(i, n) for i, n in chunks])
    return out


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
@pytest.mark.parametrize("ftype,quantization", [("Q4_K_M", "gguf"), ("Q8_0", "int8")])
def test_native_stack_is_bit_identical_to_the_python_gemma_layers(arch, ftype, quantization,
                                                                  gemma_files, caplog):
    with caplog.at_level(logging.INFO, logger="radixserve.models.native_stack"):
        runner = runner_for(gemma_files(arch, ftype), quantization=quantization)
    tokens = prompts(runner.config.vocab_size, _LENGTHS, seed=9)
    native_out = _run(runner, tokens)
    assert isinstance(runner.model._stack, NativeLayerStack)
    assert "one native call per layer" in caplog.text
    runner.model._stack = PythonLayerStack(runner.model.layers)
    python_out = _run(runner, tokens)
    assert len(native_out) == len(python_out) == 8
    for a, b in zip(native_out, python_out):
        assert torch.equal(a, b)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_a_sequence_alone_equals_it_in_a_batch(arch, gemma_files):
    runner = runner_for(gemma_files(arch, "Q4_K_M"), quantization="gguf")
    tokens = prompts(runner.config.vocab_size, _LENGTHS, seed=10)
    batched = _run(runner, tokens)[0::2]  # sequence 0's logits at each step
    assert isinstance(runner.model._stack, NativeLayerStack)
    for a, b in zip(_run(runner, tokens, seqs=(0,)), batched):
        assert torch.equal(a, b)


def test_float_gemma_keeps_the_python_layers(gemma_files):
    runner = runner_for(gemma_files("gemma3", "Q8_0"))  # quantization none: float linears
    runner.all_logits([Paged([[1, 2, 3]], 4).chunk(0, 3)])
    assert isinstance(runner.model._stack, PythonLayerStack)
