"""The Ray executor's rules that need no cluster: shared storage, bundles and strategies, log offsets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.errors import InvalidInputError, StorageError
from trainyard.executors.ray import (
    _log_header,
    _mirrored_log_bytes,
    accelerator_resource,
    bundle_for,
    check_shared_storage,
    placement_strategy,
    pool_resource,
    shared_paths_from_env,
    shared_storage_problem,
)
from trainyard.settings import Settings

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "url",
    ["s3://bucket/ckpt", "gs://b/c", "az://container/x", "hdfs://nn/ckpt", "simplecache::s3://b/c"],
)
def test_object_stores_are_shared(url: str) -> None:
    assert shared_storage_problem(url, []) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///home/me/.trainyard/checkpoints", "not storage every Ray node reaches"),
        ("/home/me/ckpt", "not storage every Ray node reaches"),
        ("checkpoints", "relative path"),
        ("memory://ckpt", "memory"),
        ("file:///mnt/sharedX/ckpt", "not storage every Ray node reaches"),  # a sibling, not inside
        ("file:///mnt/shared/../etc", "not storage every Ray node reaches"),
        ("", "no checkpoint storage"),
    ],
)
def test_machine_local_storage_is_refused(url: str, why: str) -> None:
    problem = shared_storage_problem(url, ["/mnt/shared"])
    assert problem is not None and why in problem
    with pytest.raises(StorageError) as info:
        check_shared_storage(url, ["/mnt/shared"])
    assert info.value.code == "storage_error" and "TRAINYARD_RAY_SHARED_PATHS" in info.value.hint


@pytest.mark.parametrize("url", ["file:///mnt/shared/ckpt", "/mnt/shared", "/nfs/b/x/y", "file:///nfs/b"])
def test_paths_under_a_declared_shared_mount_are_accepted(url: str) -> None:
    assert shared_storage_problem(url, shared_paths_from_env("/mnt/shared:/nfs/b")) is None


def test_shared_paths_from_env_accepts_colons_and_commas() -> None:
    assert shared_paths_from_env("/a:/b,/c") == ["/a", "/b", "/c"]
    assert shared_paths_from_env(None) == [] and shared_paths_from_env("") == []


def test_bundle_takes_the_pool_the_common_accelerator_label_and_gpus() -> None:
    pool = pool_resource("a100-spot")
    acc = accelerator_resource("a100-80gb")
    nodes = [
        {pool: 8.0, acc: 8.0, "GPU": 8.0, "CPU": 96.0},
        {pool: 8.0, acc: 8.0, "GPU": 8.0, "CPU": 96.0},
        {"CPU": 4.0},  # not in the pool
    ]
    bundle, per_node = bundle_for("a100-spot", nodes, cpus_per_rank=4)
    assert bundle == {pool: 1.0, acc: 1.0, "GPU": 1.0, "CPU": 4.0}
    assert per_node == 8
    assert placement_strategy(8, per_node) == "STRICT_PACK"
    assert placement_strategy(16, per_node) == "PACK"


def test_cpus_bound_the_ranks_per_node_and_unknown_pools_wait() -> None:
    pool = pool_resource("cpu")
    bundle, per_node = bundle_for("cpu", [{pool: 4.0, "CPU": 2.0}], cpus_per_rank=1)
    assert bundle == {pool: 1.0, "CPU": 1.0} and per_node == 2
    assert bundle_for("nowhere", [{pool: 4.0, "CPU": 2.0}], cpus_per_rank=1) == (
        {pool_resource("nowhere"): 1.0, "CPU": 1.0},
        0,
    )
    assert placement_strategy(1, 0) == "PACK"  # no node known yet: do not pin to one


@given(world=st.integers(1, 64), per_node=st.integers(0, 64))
def test_strict_pack_exactly_when_one_node_holds_the_gang(world: int, per_node: int) -> None:
    strict = placement_strategy(world, per_node) == "STRICT_PACK"
    assert strict == (per_node >= 1 and world <= per_node)


def test_adoption_resumes_log_copying_after_the_launch_header(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    assert _mirrored_log_bytes(log, 2, 0) == 0
    log.write_bytes(_log_header(1, 0, "pool p, PACK") + b"attempt one\n" + _log_header(2, 0, "pool p, PACK"))
    assert _mirrored_log_bytes(log, 2, 0) == 0
    with open(log, "ab") as fh:
        fh.write(b"--- attempt 2 rank 0 ---\nstep 1\n")
    assert _mirrored_log_bytes(log, 2, 0) == len(b"--- attempt 2 rank 0 ---\nstep 1\n")


def test_an_address_where_nothing_listens_is_reported_at_once() -> None:
    import socket

    from trainyard.errors import ServiceUnavailableError
    from trainyard.executors.ray import RayExecutor, _unreachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert _unreachable(f"127.0.0.1:{port}") is None
        assert _unreachable(f"ray://127.0.0.1:{port}") is None
    assert "nothing answers" in (_unreachable(f"127.0.0.1:{port}") or "")
    assert _unreachable("auto") is None
    t0 = time.time()
    with pytest.raises(ServiceUnavailableError, match="cannot connect to the Ray cluster"):
        RayExecutor(f"127.0.0.1:{port}")
    assert time.time() - t0 < 10
    with pytest.raises(InvalidInputError, match="needs the address"):
        RayExecutor(settings=Settings(ray_address=None))
