"""The disk tier's flags: on by default in ``serve`` under radixserve's cache folder, off
elsewhere unless a folder is given; ``--no-kv-disk-cache`` wins; a bad budget is refused."""

from __future__ import annotations

import argparse
import os

import pytest

from radixserve.cli_args import add_engine_args, engine_kwargs
from radixserve.config import KVDiskConfig
from radixserve.serve_args import add_serve_args


def serve_kwargs(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return engine_kwargs(parser.parse_args(list(argv)))


def engine_only_kwargs(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_kwargs(parser.parse_args(list(argv)))


def test_serve_default_is_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RADIXSERVE_KV_DISK_CACHE", raising=False)  # the suite's "off"
    kw = serve_kwargs()
    assert kw["kv_disk_cache"] == os.path.join(str(tmp_path), "kv")
    assert kw["kv_disk_cache_gb"] is None
    kw = serve_kwargs("--kv-disk-cache", "~/x", "--kv-disk-cache-gb", "2.5")
    assert (kw["kv_disk_cache"], kw["kv_disk_cache_gb"]) == (os.path.expanduser("~/x"), 2.5)
    assert serve_kwargs("--no-kv-disk-cache", "--kv-disk-cache", "/x")["kv_disk_cache"] is None
    monkeypatch.setenv("RADIXSERVE_KV_DISK_CACHE", "off")
    assert serve_kwargs()["kv_disk_cache"] is None
    assert serve_kwargs("--kv-disk-cache", "/x")["kv_disk_cache"] == "/x"  # the flag wins
    monkeypatch.setenv("RADIXSERVE_KV_DISK_CACHE", str(tmp_path / "elsewhere"))
    assert serve_kwargs()["kv_disk_cache"] == str(tmp_path / "elsewhere")


def test_other_commands_are_off_unless_given():
    assert engine_only_kwargs()["kv_disk_cache"] is None
    assert engine_only_kwargs("--kv-disk-cache", "/d")["kv_disk_cache"] == "/d"


def test_bad_budgets_are_refused(capsys):
    with pytest.raises(SystemExit):
        serve_kwargs("--kv-disk-cache-gb", "0")
    assert "--kv-disk-cache-gb" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kv_disk_cache_gb"):
        KVDiskConfig("/d", -1.0)


def test_replicas_disk_counters_are_summed():
    from radixserve.cluster.dp_client import sum_stats
    from radixserve.core.reports import SchedulerStats
    from radixserve.kvdisk.stats import KV_DISK_FIELDS

    stats = [SchedulerStats(**{f: i + 1 for f in KV_DISK_FIELDS}) for i in range(2)]
    summed = sum_stats(stats)
    assert all(getattr(summed, f) == 3 for f in KV_DISK_FIELDS)
