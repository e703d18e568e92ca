"""The kernel boundary (kernels/ops.py): the only module that takes raw pointers, and its
argument checks, which name the kernel and the argument."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import radixserve
from radixserve.kernels import native, ops

needs_native = pytest.mark.skipif(native.load() is None, reason="native kernels unavailable")
ROOT = Path(radixserve.__file__).parent


def _calls_data_ptr(path: Path) -> bool:
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(node, ast.Attribute) and node.attr == "data_ptr"
               for node in ast.walk(tree)) or "data_ptr" in path.read_text()


def _calls_kernels(path: Path) -> bool:
    """An ``x.rs_*`` attribute: a call into the library (kernels/native.py's signatures)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(node, ast.Attribute) and node.attr.startswith("rs_")
               for node in ast.walk(tree))


def test_only_ops_takes_data_ptr():
    ops_path = ROOT / "kernels" / "ops.py"
    boundary = {ops_path, ROOT / "kernels" / "recurrent_ops.py"}  # (the recurrent layers')
    offenders = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py"))
                 if p not in boundary and _calls_data_ptr(p)]
    assert offenders == []
    assert _calls_data_ptr(ops_path)


def test_only_ops_calls_the_kernels():
    """native.py loads the library (its version, level and AMX set-up); ops.py runs it."""
    allowed = {ROOT / "kernels" / "ops.py", ROOT / "kernels" / "native.py",
               ROOT / "kernels" / "recurrent_ops.py"}
    assert [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py"))
            if p not in allowed and _calls_kernels(p)] == []


@needs_native
def test_a_wrong_dtype_names_the_kernel_and_the_argument():
    with pytest.raises(TypeError, match=r"rs_rms_norm: x must be torch.float32, got "
                                        r"torch.float64"):
        ops.rms_norm(torch.zeros(2, 8, dtype=torch.float64), torch.ones(8), 1e-6)
    with pytest.raises(TypeError, match="rs_apply_bitmask: bitmask must be torch.int32"):
        ops.apply_bitmask(torch.zeros(2, 64), torch.tensor([0]), torch.zeros(1, 2))
    with pytest.raises(TypeError, match="rs_rotary: positions must be torch.int64"):
        ops.rotary_(torch.zeros(3, 2, 8), torch.zeros(3, 1, 8), torch.zeros(3, dtype=torch.int32),
                    torch.zeros(16, 8), torch.zeros(16, 8))


@needs_native
def test_a_non_contiguous_tensor_names_the_kernel_and_the_argument():
    with pytest.raises(ValueError, match="rs_silu_mul: gate_up must be contiguous"):
        ops.glu(torch.zeros(16, 4).t(), "silu")
    with pytest.raises(ValueError, match="rs_add_rms_norm: residual must be contiguous"):
        ops.add_rms_norm(torch.zeros(4, 8), torch.zeros(8, 4).t(), torch.ones(8), 1e-6)
    q = torch.zeros(3, 8, 2).transpose(1, 2)  # [3, 2, 8], heads not contiguous
    with pytest.raises(ValueError, match="rs_rotary: q must have each row's heads contiguous"):
        ops.rotary_(q, torch.zeros(3, 1, 8), torch.zeros(3, dtype=torch.int64),
                    torch.zeros(16, 8), torch.zeros(16, 8))


@needs_native
def test_a_wrong_shape_names_the_kernel_and_the_argument():
    with pytest.raises(ValueError, match=r"rs_rms_norm: x must have 2 dimensions, got shape "
                                         r"\(8,\)"):
        ops.rms_norm(torch.zeros(8), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="rs_rms_norm: the weight's size is 4, expected 8"):
        ops.rms_norm(torch.zeros(2, 8), torch.ones(4), 1e-6)
    weight = ops.Int8Weight(torch.ones(4, 8, dtype=torch.int8), torch.ones(4), None)
    with pytest.raises(ValueError, match="rs_int8_linear: x's width is 6, expected 8"):
        ops.int8_linear(torch.zeros(2, 6), weight)
    with pytest.raises(ValueError, match="rs_rotary: the number of positions is 2, expected 3"):
        ops.rotary_(torch.zeros(3, 2, 8), torch.zeros(3, 1, 8), torch.zeros(2, dtype=torch.int64),
                    torch.zeros(16, 8), torch.zeros(16, 8))
