"""The native layer stack (one kernel call per decoder layer) gives the same bits as the Python
layers calling the same kernels (Llama, Qwen2's biases, Qwen3's q/k norms; Gemma:
test_gemma_native_stack.py), and is chosen only where every piece of a layer is native."""

from __future__ import annotations

import pytest
import torch
from test_int8_embedded import TEXT, _logits
from test_numerics import PagedSeqs, make_runner

from radixserve.kernels import native
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack

needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
# Tiny models are built per CPU level (kernel_level); the embedded one is the session's, built
# at the best level (a model's weights are packed for the level that loaded them).
each_level = pytest.mark.usefixtures("kernel_level")


def _steps(runner, tokens):
    paged = PagedSeqs(tokens)
    out = []
    for step in ([(0, 8), (1, 5)], [(0, 3), (1, 1)], [(0, 1), (1, 1)]):
        out += runner.all_logits([paged.chunk(i, n) for i, n in step])
    return out


@needs_native
@each_level
@pytest.mark.parametrize("arch,quantization", [("llama", "gguf"), ("llama", "int8"),
                                               ("qwen2", "gguf"), ("qwen2", "int8"),
                                               ("qwen3", "gguf"), ("qwen3", "int8")])
def test_native_stack_is_bit_identical_to_the_python_layers(arch, quantization,
                                                            tiny_gguf_files):
    path = tiny_gguf_files(arch, "Q4_0")
    runner = make_runner(path, quantization=quantization)
    tokens = [[(7 * i + 3) % runner.config.vocab_size for i in range(12)],
              [(5 * i + 1) % runner.config.vocab_size for i in range(7)]]
    native_out = _steps(runner, tokens)  # chunked prefill, then decode steps
    assert isinstance(runner.model._stack, NativeLayerStack)
    runner.model._stack = PythonLayerStack(runner.model.layers)
    python_out = _steps(runner, tokens)
    for a, b in zip(native_out, python_out):
        assert torch.equal(a, b)


@needs_native
@each_level
def test_python_layers_where_a_piece_is_not_native(tiny_gguf_files):
    runner = make_runner(tiny_gguf_files("llama", "Q4_0"), quantization="none")  # float
    _steps(runner, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [3, 4, 5, 6, 7, 8, 9]])
    assert isinstance(runner.model._stack, PythonLayerStack)


@needs_native
def test_embedded_model_native_stack_equals_python_layers(embedded_llm):
    model = embedded_llm.engine.runner.model
    ids = embedded_llm.get_tokenizer().encode(TEXT)
    fast = _logits(embedded_llm, ids)
    assert isinstance(model._stack, NativeLayerStack)
    try:
        model._stack = PythonLayerStack(model.layers)
        assert torch.equal(_logits(embedded_llm, ids), fast)
    finally:
        model._stack = None  # rebuilt at the next forward
