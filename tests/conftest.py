"""Shared fixtures: tiny random models as Hugging Face folders and GGUF files (see tiny_models),
and ``kernel_level``: a kernel test once per CPU level this machine runs and has built
(kernels/levels.py), each forced through RADIXSERVE_CPU_ISA as a new process would."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# derived-data caches (the GGUF tokenizer's, packed weights) in a folder of this run, not the
# user's home, removed when the run ends
if "RADIXSERVE_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["RADIXSERVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="rs-cache-")
    atexit.register(shutil.rmtree, os.environ["RADIXSERVE_CACHE_DIR"], True)
# every engine the tests start (servers' too) keeps the fixed 1 GiB pool, not a share of the
# machine's memory (engine/kv_budget.py); tests of that default remove it
os.environ.setdefault("RADIXSERVE_KV_CACHE_MEMORY_GB", "1")
# servers the tests start keep no disk tier unless a test gives one (kvdisk/args.py): one test's
# pages saved at its server's exit would be another's cache hits
os.environ.setdefault("RADIXSERVE_KV_DISK_CACHE", "off")
# the vision towers' attention and 16-bit matrices in float32 whatever the CPU (their parity
# tests'; the bfloat16 ones have their own: tests/models/test_gemma3_vision.py)
os.environ.setdefault("RADIXSERVE_VISION_ATTENTION", "float32")
os.environ.setdefault("RADIXSERVE_VISION_MATMUL", "float32")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tiny_models import ARCHS, FTYPES, hf_to_gguf, make_hf_model  # noqa: E402

from radixserve.kernels import native  # noqa: E402


class GGUFFiles(dict):
    """`(arch, ftype) -> Path` of a GGUF converted from `tiny_hf_dirs[arch]`, built on first use.

    Index it (`files["llama", "Q8_0"]`) or call it (`files("llama", "Q8_0")`). Each GGUF sits
    alone in its own folder, so `from_pretrained(path.parent, gguf_file=path.name)` works.
    """

    def __init__(self, hf_dirs: dict[str, Path], root: Path):
        super().__init__()
        self._hf_dirs = hf_dirs
        self._root = root

    def __missing__(self, key: tuple[str, str]) -> Path:
        arch, ftype = key
        if arch not in self._hf_dirs or ftype not in FTYPES:
            raise KeyError(key)
        out = self._root / f"{arch}-{ftype}" / f"tiny-{arch}-{ftype}.gguf"
        path = hf_to_gguf(self._hf_dirs[arch], out, ftype)
        self[key] = path
        return path

    def __call__(self, arch: str, ftype: str = "F32") -> Path:
        return self[arch, ftype]


@pytest.fixture(scope="session")
def tiny_hf_dirs(tmp_path_factory) -> dict[str, Path]:
    """arch -> Hugging Face folder of a tiny random model (seed 0, default config)."""
    root = tmp_path_factory.mktemp("tiny_hf")
    return {arch: make_hf_model(arch, root / arch, seed=0) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_gguf_files(tiny_hf_dirs, tmp_path_factory) -> GGUFFiles:
    """Lazy `(arch, ftype) -> GGUF path` mapping, also callable: `tiny_gguf_files(arch, ftype)`."""
    return GGUFFiles(tiny_hf_dirs, tmp_path_factory.mktemp("tiny_gguf"))


@pytest.fixture(scope="session")
def embedded_llm():
    """One LLM on the embedded SmolLM2-135M GGUF, shared by the whole session."""
    from radixserve import LLM

    return LLM(show_progress=False)


def _levels() -> list[str]:
    info = native.describe()
    levels = [level for level in info.runnable if level in info.built]
    return levels or ["none"]


@pytest.fixture(params=_levels())
def kernel_level(request):
    """The level under test (its library is what ``native.load()`` returns meanwhile); "none"
    where no kernel library is installed."""
    saved = os.environ.get(native.ISA_ENV)
    if request.param != "none":
        os.environ[native.ISA_ENV] = request.param
    native.reset()
    try:
        yield request.param
    finally:
        if saved is None:
            os.environ.pop(native.ISA_ENV, None)
        else:
            os.environ[native.ISA_ENV] = saved
        native.reset()


@pytest.fixture(scope="session")
def tiny_moe_files(tmp_path_factory):
    """Lazy ``(arch, ftype) → path`` of the tiny MoE models (tiny_moe.py): ftype "hf" is the
    Hugging Face folder, F32 / F16 / Q8_0 / Q4_0 a GGUF converted from it; built on first use."""
    from tiny_moe import make_moe_hf_model, moe_hf_to_gguf

    root, made = tmp_path_factory.mktemp("tiny_moe"), {}

    def get(arch: str, ftype: str = "hf") -> Path:
        if (arch, ftype) not in made:
            made[arch, ftype] = (make_moe_hf_model(arch, root / arch, seed=0) if ftype == "hf"
                                 else moe_hf_to_gguf(get(arch), root / f"{arch}-{ftype}"
                                                     / f"tiny-{arch}-{ftype}.gguf", ftype))
        return made[arch, ftype]
    return get
