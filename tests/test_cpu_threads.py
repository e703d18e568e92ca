"""Thread counts that fit the machine: affinity mask, cgroup quota, ``--threads`` (no model)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from radixserve.cpu import threads as cpu_threads
from radixserve.__main__ import main
from radixserve.cpu.threads import available_cpus, cgroup_cpu_limit, engine_threads


def _root(tmp_path, files: dict[str, str], proc: str = "0::/\n"):
    """A fake cgroup tree under tmp_path/cg and a fake /proc/self/cgroup; returns both."""
    root = tmp_path / "cg"
    root.mkdir(parents=True)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc_file = tmp_path / "proc_cgroup"
    proc_file.write_text(proc)
    return root, proc_file


# -- cgroup v2 -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("200000 100000\n", 2),
    ("150000 100000\n", 2),   # 1.5 CPUs: rounded up
    ("50000 100000\n", 1),    # half a CPU: at least 1
    ("1 100000\n", 1),
    ("400000 50000\n", 8),
    ("max 100000\n", None),   # no limit
    ("max\n", None),
    ("", None),
    ("garbage\n", None),
    ("abc 100000\n", None),
    ("200000 abc\n", None),
    ("200000 0\n", None),
    ("-5 100000\n", None),
    ("1 2 3\n", None),
    ("\xff\xfe", None),
])
def test_cgroup_v2_cpu_max(tmp_path, text, expected):
    root, proc = _root(tmp_path, {"cpu.max": text})
    assert cgroup_cpu_limit(root, proc) == expected


def test_cgroup_v2_binary_garbage_is_no_limit(tmp_path):
    root, proc = _root(tmp_path, {})
    (root / "cpu.max").write_bytes(b"\x80\x81\x00\xff")
    assert cgroup_cpu_limit(root, proc) is None


def test_missing_files_are_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "nothing", tmp_path / "no_proc_file") is None
    root, proc = _root(tmp_path, {})
    assert cgroup_cpu_limit(root, proc) is None


def test_cgroup_v2_own_cgroup_path_first(tmp_path):
    root, proc = _root(tmp_path, {"app.slice/svc/cpu.max": "300000 100000\n"},
                       proc="0::/app.slice/svc\n")
    assert cgroup_cpu_limit(root, proc) == 3


def test_cgroup_v2_falls_back_to_the_root(tmp_path):
    # a container without a cgroup namespace: /proc names the host's path, the root is its own
    root, proc = _root(tmp_path, {"cpu.max": "200000 100000\n"},
                       proc="0::/docker/0123abcd\n")
    assert cgroup_cpu_limit(root, proc) == 2


def test_cgroup_v2_smallest_quota_up_the_tree_applies(tmp_path):
    root, proc = _root(tmp_path, {"a/cpu.max": "200000 100000\n",
                                  "a/b/cpu.max": "max 100000\n",
                                  "cpu.max": "800000 100000\n"},
                       proc="0::/a/b\n")
    assert cgroup_cpu_limit(root, proc) == 2


def test_garbage_proc_cgroup_still_reads_the_root(tmp_path):
    root, proc = _root(tmp_path, {"cpu.max": "200000 100000\n"}, proc="garbage\n\x00::\n")
    assert cgroup_cpu_limit(root, proc) == 2
    root2, proc2 = _root(tmp_path / "x", {"cpu.max": "200000 100000\n"},
                         proc="0::/../../etc\n")
    assert cgroup_cpu_limit(root2, proc2) == 2


# -- cgroup v1 -------------------------------------------------------------------------------

@pytest.mark.parametrize("quota, period, expected", [
    ("200000", "100000", 2),
    ("250000", "100000", 3),
    ("50000", "100000", 1),
    ("-1", "100000", None),   # no limit
    ("garbage", "100000", None),
    ("200000", "", None),
    ("200000", "0", None),
])
def test_cgroup_v1_cfs_quota(tmp_path, quota, period, expected):
    root, proc = _root(tmp_path, {"cpu/cpu.cfs_quota_us": quota + "\n",
                                  "cpu/cpu.cfs_period_us": period + "\n"})
    assert cgroup_cpu_limit(root, proc) == expected


def test_cgroup_v1_quota_without_period_is_no_limit(tmp_path):
    root, proc = _root(tmp_path, {"cpu/cpu.cfs_quota_us": "200000\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_cgroup_v1_own_path_and_combined_controller_folder(tmp_path):
    root, proc = _root(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000\n",
                                  "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"},
                       proc="4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_limit(root, proc) == 4


# -- available_cpus: affinity and quota together ---------------------------------------------

def test_affinity_limits_the_result(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    root, proc = _root(tmp_path, {"cpu.max": "max 100000\n"})
    assert available_cpus(root, proc) == 3
    root, proc = _root(tmp_path / "q", {"cpu.max": "800000 100000\n"})
    assert available_cpus(root, proc) == 3  # affinity 3 < quota 8


def test_quota_limits_the_result(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    root, proc = _root(tmp_path, {"cpu.max": "200000 100000\n"})
    assert available_cpus(root, proc) == 2  # a container given 2 of 64 cores


def test_no_affinity_call_falls_back_to_cpu_count(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    root, proc = _root(tmp_path, {})
    assert available_cpus(root, proc) == 5


def test_failing_affinity_call_falls_back_to_cpu_count(tmp_path, monkeypatch):
    def fail(pid):
        raise OSError("nope")

    monkeypatch.setattr(os, "sched_getaffinity", fail, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    root, proc = _root(tmp_path, {})
    assert available_cpus(root, proc) == 1


def test_this_machine_is_at_least_one():
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)


# -- engine_threads --------------------------------------------------------------------------

def test_engine_threads_override_and_default(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda *a, **k: 6)
    assert engine_threads(None) == 6
    assert engine_threads(3) == 3
    assert engine_threads(100) == 100  # an explicit count is taken as given


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_engine_threads_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="threads"):
        engine_threads(bad)


def test_llm_rejects_bad_threads_before_loading():
    from radixserve import LLM

    with pytest.raises(ValueError, match="threads must be"):
        LLM(threads=0)


def test_apply_sets_torch_and_omp_env(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "99")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "_applied", None)
    try:
        assert cpu_threads.apply_engine_threads(1) == 1
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == "1"  # for the engine's children
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)


# -- the CLI ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["serve"],
                                     ["bench", "offline"]])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_cli_rejects_bad_threads(command, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--threads", value])
    assert exc.value.code == 2
    assert "--threads" in capsys.readouterr().err


def test_cli_passes_threads_to_the_engine_kwargs():
    import argparse

    from radixserve.cli_args import add_engine_args, engine_kwargs

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_kwargs(parser.parse_args(["--threads", "3"]))["threads"] == 3
    assert engine_kwargs(parser.parse_args([]))["threads"] is None


# -- processes -------------------------------------------------------------------------------

def _python(code: str, **env) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_api_process_and_engine_entry_do_not_load_torch():
    """What the spawned engine process imports before it builds the engine (the CLI's module,
    re-imported as the child's main, and the engine entry) loads neither torch nor numpy, so
    the engine can set OMP_NUM_THREADS before libgomp reads it; what the API process imports
    to serve loads no torch."""
    out = _python("""
        import sys
        import radixserve.__main__, radixserve.cpu.threads
        import radixserve.engine.core_proc
        before = [m for m in ("torch", "numpy") if m in sys.modules]
        import radixserve.serve
        import radixserve.frontend.async_llm, radixserve.frontend.core_client
        import radixserve.tokenizer.tokenizer, radixserve.frontend.app
        print(before, "torch" in sys.modules)
    """)
    assert out == "[] False"


def test_serve_limits_the_api_threads_before_numpy_loads():
    """`radixserve serve` caps the API process's BLAS / OpenMP threads before the serve
    modules load numpy (OpenBLAS reads its thread count once, at load)."""
    out = _python("""
        import sys
        import radixserve.cpu.threads as threads
        seen = []
        real = threads.limit_api_threads
        threads.limit_api_threads = lambda: (seen.append("numpy" in sys.modules), real())
        from radixserve.__main__ import main
        try:
            main(["serve", "--help"])
        except SystemExit:
            pass
        print(seen, "numpy" in sys.modules)
    """)
    assert out.splitlines()[-1] == "[False] True"


def test_engine_threads_set_before_torch_reach_other_threads():
    """Applied before torch loads, the count holds in threads other than the caller too
    (libgomp's default), not only in the thread that called torch.set_num_threads."""
    out = _python("""
        import threading
        from radixserve.cpu.threads import apply_engine_threads
        apply_engine_threads(1)
        import torch
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start(); t.join()
        print(torch.get_num_threads(), seen[0])
    """, OMP_NUM_THREADS="7")
    assert out == "1 1"


def test_background_priority_lowers_only_the_calling_thread():
    import os
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from radixserve.cpu.threads import BACKGROUND_NICE, background_priority

    def nice_of_this_thread():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = nice_of_this_thread()
    with ThreadPoolExecutor(1, initializer=background_priority) as pool:
        assert pool.submit(nice_of_this_thread).result() == max(before, BACKGROUND_NICE)
    assert nice_of_this_thread() == before
