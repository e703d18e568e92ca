"""``--distributed-executor-backend ray`` at the edges, without a cluster: the flag without Ray
installed says how to get it; the Ray builds are unpinned with the bundle's CPUs as threads;
a placement strategy or CPU count Ray does not take is refused naming the supported ones."""

from __future__ import annotations

import functools
import sys

import pytest

from radixserve.cluster.dp_args import ray_config, replica_builds
from radixserve.cluster.ray_executor import RayConfig, require_ray
from radixserve.serve import add_serve_args


def _args(*flags: str):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return parser.parse_args(list(flags))


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(SystemExit, match=r"needs Ray.*pip install 'radixserve\[ray\]'"):
        require_ray()


def test_the_flags_make_a_ray_config_and_mp_makes_none(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_config(_args()) is None
    assert ray_config(_args("--distributed-executor-backend", "ray")) == RayConfig("auto")
    config = ray_config(_args("--distributed-executor-backend", "ray", "--threads", "3",
                              "--ray-address", "10.0.0.1:6379",
                              "--ray-placement-strategy", "STRICT_SPREAD"))
    assert config == RayConfig("10.0.0.1:6379", "STRICT_SPREAD", 3)
    config = ray_config(_args("--distributed-executor-backend", "ray", "--threads", "3",
                              "--ray-cpus-per-replica", "8"))
    assert config.cpus_per_replica == 8


def test_ray_builds_are_unpinned_with_the_bundle_cpus_as_threads():
    make = functools.partial(functools.partial, dict)  # make(threads) → a build
    builds = replica_builds(2, lambda t: make(threads=t), None, RayConfig(cpus_per_replica=4))
    assert [b() for b in builds] == [{"threads": 4}, {"threads": 4}]
    builds = replica_builds(2, lambda t: make(threads=t), 2, RayConfig(cpus_per_replica=4))
    assert [b() for b in builds] == [{"threads": 2}, {"threads": 2}]


def test_unsupported_ray_settings_are_refused_naming_the_supported():
    with pytest.raises(ValueError, match="supported: SPREAD, PACK, STRICT_SPREAD"):
        RayConfig(placement_strategy="RANDOM")
    with pytest.raises(ValueError, match="CPUs per replica must be >= 1"):
        RayConfig(cpus_per_replica=0)
    with pytest.raises(SystemExit):
        _args("--distributed-executor-backend", "k8s")
