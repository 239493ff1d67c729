"""Checkpoint manager: atomic commit, sha256 verification, skipping torn/corrupt steps, retention."""

from __future__ import annotations

import itertools
import json
import os
import types
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.runtime.checkpoint import MANIFEST, CheckpointManager, CheckpointWriteError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

_ROOTS = itertools.count()


def _state(value: float) -> dict[str, torch.Tensor]:
    return {"model": {"w": torch.full((64, 8), value), "b": torch.arange(8, dtype=torch.float32) * value}}


def _manager(root: Path, events: list | None = None, **kw) -> CheckpointManager:
    def emit(kind: str, **data) -> None:
        if events is not None:
            events.append((kind, data))

    return CheckpointManager(f"file://{root}", "job", emit=emit, **kw)


def _save(mgr: CheckpointManager, step: int, *, loss: float | None = None, blocking: bool = True) -> None:
    mgr.save(step, _state(float(step)), {"loss": loss, "precision": {"name": "fp32"}}, blocking=blocking)


def _load(mgr: CheckpointManager) -> tuple[int, float]:
    ref = mgr.latest_valid()
    assert ref is not None
    target = _state(0.0)
    mgr.load(ref, target)
    return ref.step, float(target["model"]["w"][0, 0])


def test_async_and_sync_saves_commit_a_verifiable_manifest(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1, blocking=False)
    assert mgr.wait() is not None
    _save(mgr, 2)
    step_dir = tmp_path / "job" / "step-2"
    man = json.loads((step_dir / MANIFEST).read_text())
    assert man["step"] == 2 and man["world_size"] == 1 and man["format"] == "trainyard-checkpoint/1"
    assert set(man["files"]) == {p.name for p in step_dir.iterdir() if p.name != MANIFEST}
    assert all(len(f["sha256"]) == 64 for f in man["files"].values())
    assert _load(mgr) == (2, 2.0)
    kinds = [k for k, _ in events]
    assert kinds.count("checkpoint") == 2
    mgr.close()


def test_torn_step_without_manifest_is_never_loaded(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 3)
    _save(mgr, 4)
    (tmp_path / "job" / "step-4" / MANIFEST).unlink()  # the writer died before committing
    assert _load(mgr) == (3, 3.0)
    assert any("torn" in d.get("why", "") and d.get("skipped_step") == 4 for _, d in events)


@given(data=st.data())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_flipped_byte_in_any_shard_is_detected(tmp_path: Path, data: st.DataObject) -> None:
    root = tmp_path / f"r{next(_ROOTS)}"
    mgr = _manager(root)
    _save(mgr, 5)
    _save(mgr, 6)
    step6 = root / "job" / "step-6"
    files = sorted(p for p in step6.iterdir() if p.name != MANIFEST)
    victim = data.draw(st.sampled_from(files))
    raw = bytearray(victim.read_bytes())
    # a position relative to the file's length: lengths vary with the directory's name (the metadata
    # holds paths), and a draw must not depend on them
    pos = min(len(raw) - 1, int(data.draw(st.floats(0.0, 1.0, exclude_max=True)) * len(raw)))
    raw[pos] ^= data.draw(st.integers(1, 255))
    victim.write_bytes(bytes(raw))
    ok, why, _ = CheckpointManager.verify(f"file://{step6}")
    assert not ok and "sha256" in why
    assert _load(mgr) == (5, 5.0)


def test_truncated_shard_and_garbled_manifest_are_skipped(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    for s in (1, 2, 3):
        _save(mgr, s)
    shard = next(p for p in (tmp_path / "job" / "step-3").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    (tmp_path / "job" / "step-2" / MANIFEST).write_text("{not json")
    assert _load(mgr) == (1, 1.0)


def test_retention_keeps_last_k_and_the_best(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events, keep_last=2)
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 2.5}
    for step, loss in losses.items():
        _save(mgr, step, loss=loss)
    assert sorted(int(p.name.split("-")[1]) for p in (tmp_path / "job").iterdir()) == [2, 4, 5]
    # each checkpoint event names its size and the steps retention deleted (storage metering reads both)
    ck = [d for k, d in events if k == "checkpoint"]
    assert [d["removed_steps"] for d in ck] == [[], [], [1], [], [3]]  # 2 is the best, kept
    for d in ck:
        step_dir = tmp_path / "job" / f"step-{d['step']}"
        if step_dir.exists():
            on_disk = sum(p.stat().st_size for p in step_dir.iterdir() if p.name != MANIFEST)
            assert d["bytes"] == on_disk > 0


def test_unwritable_storage_raises_a_clear_error_and_keeps_old_steps(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-2").write_text("a file where the step directory should go")
    with pytest.raises(CheckpointWriteError, match="step-2"):
        _save(mgr, 2)
    assert _load(mgr) == (1, 1.0)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_write_that_fails_inside_dcp_is_a_checkpoint_write_error(tmp_path: Path, blocking: bool) -> None:
    """DCP reports a failed write as CheckpointException, a BaseException: it must still surface as the
    CheckpointWriteError the trainer retries, not escape the worker's error handling."""
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-2" / ".metadata.tmp").mkdir(parents=True)  # the metadata file can't be opened
    with pytest.raises(CheckpointWriteError, match="step-2"):
        _save(mgr, 2, blocking=blocking)
        mgr.wait()
    assert _load(mgr) == (1, 1.0)


def test_fallback_root_is_considered_when_loading(tmp_path: Path) -> None:
    mgr = _manager(tmp_path / "primary", fallback_url=f"file://{tmp_path / 'fallback'}")
    _save(mgr, 1)
    mgr.save(2, _state(2.0), {}, blocking=True, root=mgr.fallback_job_url)
    assert _load(mgr) == (2, 2.0)


def test_remove_newer_than_clears_leftovers(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    os.makedirs(tmp_path / "job" / "step-7")
    mgr.remove_newer_than(1)
    assert not (tmp_path / "job" / "step-7").exists() and (tmp_path / "job" / "step-1").exists()


def test_dtype_conversion_on_load(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    ref = mgr.latest_valid()
    assert ref is not None
    target = {
        "model": {"w": torch.zeros((64, 8), dtype=torch.bfloat16), "b": torch.zeros(8, dtype=torch.bfloat16)}
    }
    mgr.load(ref, target)
    assert target["model"]["w"].dtype == torch.bfloat16 and float(target["model"]["b"][3]) == 3.0


def test_storage_vanishing_between_write_and_commit_is_a_checkpoint_write_error(tmp_path: Path) -> None:
    # a shard that can be listed but not read (storage went away after the write) must surface as
    # CheckpointWriteError, which the trainer turns into "checkpoint storage failed" and a fallback save
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    step_dir = tmp_path / "job" / "step-2"
    step_dir.mkdir(parents=True)
    (step_dir / "__0_0.distcp").symlink_to(tmp_path / "gone" / "__0_0.distcp")
    with pytest.raises(CheckpointWriteError, match="hashing the shards"):
        mgr._commit(f"file://{step_dir}", 2, {}, mgr.last_save)  # type: ignore[arg-type]
    assert not (step_dir / MANIFEST).exists()
    assert _load(mgr) == (1, 1.0)
    mgr.close()


def test_manifest_that_omits_a_damaged_shard_fails_verification_and_the_previous_step_is_used(
    tmp_path: Path,
) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)
    step2 = tmp_path / "job" / "step-2"
    shard = next(p for p in step2.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"damaged")
    man = json.loads((step2 / MANIFEST).read_text())
    del man["files"][shard.name]
    (step2 / MANIFEST).write_text(json.dumps(man))
    ok, why, _ = CheckpointManager.verify(mgr.step_url(2))
    assert not ok and shard.name in why
    # the same when the damaged shard is gone from disk too: the index still needs it
    shard.unlink()
    ok, why, _ = CheckpointManager.verify(mgr.step_url(2))
    assert not ok and f"shard {shard.name} is not in the manifest" in why
    assert _load(mgr) == (1, 1.0)
    assert any(d.get("skipped_step") == 2 for k, d in events if k == "log")
    mgr.close()


def test_a_file_on_disk_that_the_manifest_does_not_list_fails_verification(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    (tmp_path / "job" / "step-1" / "__1_0.distcp").write_bytes(b"stray")
    ok, why, _ = CheckpointManager.verify(mgr.step_url(1))
    assert not ok and "__1_0.distcp is on disk but not in the manifest" in why
    mgr.close()


def test_quarantined_step_is_never_chosen_again(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)
    ref = mgr.latest_valid()
    assert ref is not None and ref.step == 2
    moved = mgr.quarantine(ref, "loading failed: test")
    assert moved is not None and "quarantined-step-2-" in moved
    assert _load(mgr) == (1, 1.0)
    assert [s for s, _ in mgr.list_step_dirs(mgr.job_url)] == [1]
    assert any(d.get("quarantined_step") == 2 for k, d in events if k == "log")
    mgr.close()


def test_write_thread_count_splits_by_bytes_and_items() -> None:
    from trainyard.runtime.checkpoint import MIN_BYTES_PER_WRITE_THREAD as M
    from trainyard.runtime.checkpoint import write_thread_count

    assert write_thread_count([]) == 1
    assert write_thread_count([M - 1, 100]) == 1  # small states stay in one file
    assert write_thread_count([M, M, M], max_threads=4) == 3
    assert write_thread_count([M * 10], max_threads=4) == 1  # one tensor, one file
    assert write_thread_count([M] * 10, max_threads=4) == 4


def test_parallel_shards_are_hashed_while_written_and_a_corrupt_one_is_detected(tmp_path: Path) -> None:
    import hashlib

    gen = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(1024, 1024, generator=gen) for i in range(12)}}  # 48 MiB
    events: list = []
    mgr = _manager(tmp_path, events, write_threads=3)
    crc_before = torch.serialization.get_crc32_options()
    mgr.save(1, state, {}, blocking=True)
    assert torch.serialization.get_crc32_options() == crc_before  # restored after the save
    step_dir = tmp_path / "job" / "step-1"
    shards = sorted(p.name for p in step_dir.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    man = json.loads((step_dir / MANIFEST).read_text())
    for name in [*shards, ".metadata"]:  # the hash taken while writing is the hash of the bytes on disk
        data = (step_dir / name).read_bytes()
        assert man["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    ref = mgr.latest_valid()
    assert ref is not None
    mgr.load(ref, target)
    assert all(torch.equal(target["model"][k], v) for k, v in state["model"].items())
    # by default the split follows the size (48 MiB: at most 3 files of 16 MiB), up to WRITE_THREADS
    from trainyard.runtime.checkpoint import WRITE_THREADS

    mgr_default = _manager(tmp_path / "default")
    mgr_default.save(1, state, {}, blocking=True)
    written = len(list((tmp_path / "default" / "job" / "step-1").glob("*.distcp")))
    assert written == min(3, WRITE_THREADS)
    mgr_default.close()
    mgr.save(2, state, {}, blocking=True)
    victim = tmp_path / "job" / "step-2" / "__0_2.distcp"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    victim.write_bytes(bytes(raw))
    ok, why, _ = CheckpointManager.verify(f"file://{tmp_path}/job/step-2")
    assert not ok and why == "corrupt: sha256 of __0_2.distcp does not match the manifest"
    ref = mgr.latest_valid()
    assert ref is not None and ref.step == 1
    assert any(d.get("skipped_step") == 2 for k, d in events if k == "log")
    mgr.close()


# ---- the parts of a save: staging, hashing, the manifest, the commit --------------------------------


def _step_files(step_dir: Path) -> dict[str, tuple[str, int]]:
    import hashlib

    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size)
        for p in step_dir.iterdir()
        if p.name != MANIFEST
    }


def test_staging_reuses_the_buffers_of_a_state_with_the_same_structure() -> None:
    from trainyard.runtime.checkpoint import ReusedBufferStager

    stager = ReusedBufferStager()
    state = {
        "model": {"w": torch.ones(4, 2)},
        "opt": [torch.zeros(3), (torch.ones(2), 7)],
        "rng": bytearray(b"ab"),
        "loader": types.SimpleNamespace(pos=[3]),  # any other value: a deep copy
    }
    first = stager.stage(state)
    w = first["model"]["w"]
    assert w is not state["model"]["w"] and torch.equal(w, state["model"]["w"])
    # a copy: changing the training state afterwards does not change the snapshot
    state["model"]["w"].fill_(5.0)
    state["rng"][0] = ord("z")
    state["loader"].pos[0] = 4
    assert first["loader"].pos == [3]
    assert float(first["model"]["w"][0, 0]) == 1.0 and first["rng"] == bytearray(b"ab")
    assert isinstance(first["opt"], list) and isinstance(first["opt"][1], tuple) and first["opt"][1][1] == 7
    # the same structure again: the same CPU buffers, holding the new values
    second = stager.stage(state)
    assert second["model"]["w"] is w and float(w[0, 0]) == 5.0
    assert second["opt"][0] is first["opt"][0] and second["opt"][1][0] is first["opt"][1][0]
    assert second["rng"] == bytearray(b"zb")
    # another shape, dtype, key or container type: fresh buffers
    for changed in (
        {**state, "model": {"w": torch.ones(4, 3)}},
        {**state, "model": {"w": torch.ones(4, 2, dtype=torch.float64)}},
        {**state, "model": {"v": torch.ones(4, 2)}},
        {**state, "opt": (torch.zeros(3), (torch.ones(2), 7))},
        {**state, "opt": [torch.zeros(3), [torch.ones(2), 7]]},
    ):
        base = stager.stage(state)
        assert stager.stage(state)["opt"][0] is base["opt"][0]
        assert stager.stage(changed)["opt"][0] is not base["opt"][0], changed
    assert stager.should_synchronize_after_execute is False
    assert stager.synchronize_staging() is None and stager.close() is None


def test_staging_copies_a_state_held_on_an_accelerator_into_cpu_memory() -> None:
    """The snapshot of a GPU state is made in CPU memory, not a second copy on the GPU. PyTorch's fake
    tensors stand in for CUDA ones on a machine without a GPU: they carry a tensor's device through
    every operation exactly as real ones do, with no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainyard.runtime.checkpoint import ReusedBufferStager

    stager = ReusedBufferStager()
    with FakeTensorMode():
        state = {"model": {"w": torch.empty(4, 2, device="cuda")}, "opt": [torch.empty(3, device="cuda")]}
        assert state["model"]["w"].device.type == "cuda"
        first = stager.stage(state)
        assert first["model"]["w"].device.type == "cpu" and first["opt"][0].device.type == "cpu"
        second = stager.stage(state)  # into the same CPU buffers
        assert second["model"]["w"] is first["model"]["w"] and second["model"]["w"].device.type == "cpu"


def test_staging_signatures_name_the_structure() -> None:
    from trainyard.runtime.checkpoint import ReusedBufferStager

    sig = ReusedBufferStager._sig
    assert sig(torch.zeros(2, 3)) == ("t", (2, 3), torch.float32)
    assert sig({"a": 1}) == ("d", (("a", ("o",)),))
    assert sig([1, torch.zeros(1, dtype=torch.int64)]) == ("l", "list", (("o",), ("t", (1,), torch.int64)))
    assert sig((1,)) == ("l", "tuple", (("o",),))


def test_the_hashing_stream_hashes_and_counts_every_byte_on_its_way_to_the_file() -> None:
    import array
    import hashlib
    import io

    from trainyard.runtime.checkpoint import _HashingStream

    got: list[tuple[str, int]] = []
    raw = io.BytesIO()
    stream = _HashingStream(raw, lambda d, n: got.append((d, n)))
    words = array.array("i", [1, 2, 3])  # a multi-byte item format: counted in bytes
    assert stream.write(b"abc") == 3
    assert stream.write(words) == 12
    assert stream.tell() == 15  # anything else is the file's own
    assert got == []
    stream.finish()
    assert got == [(hashlib.sha256(b"abc" + words.tobytes()).hexdigest(), 15)]
    assert raw.getvalue() == b"abc" + words.tobytes()
    assert stream.seekable() is False
    with pytest.raises(OSError, match=r"^checkpoint streams are written sequentially$"):
        stream.seek(0)

    class NoCount:  # a raw stream whose write() returns None: the stream reports the bytes it took
        def write(self, data: object) -> None:
            return None

    assert _HashingStream(NoCount(), lambda d, n: None).write(b"abcd") == 4


def test_the_writer_hashes_every_file_under_its_final_name_and_fsyncs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed.checkpoint as dcp

    from trainyard.runtime.checkpoint import hashing_writer

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "s"
    out.mkdir()
    hashes: dict[str, tuple[str, int]] = {}
    dcp.save(
        _state(1.0), storage_writer=hashing_writer(f"file://{out}", hashes, thread_count=2), no_dist=True
    )
    files = _step_files(out)
    assert set(files) == {".metadata", "__0_0.distcp", "__0_1.distcp"}
    assert hashes == {
        f"file://{out}/{name}": v for name, v in files.items()
    }  # the index under its final name
    assert {str(out / n) for n in files if n.endswith(".distcp")} <= set(synced)
    assert str(out / ".metadata.tmp") in synced  # the index is fsynced before its rename


def test_a_save_hands_the_process_group_to_dcp_and_says_whether_it_is_distributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed.checkpoint as dcp

    seen: list[tuple[str, object, bool]] = []
    real_save, real_load = dcp.save, dcp.load

    def save(state, *, storage_writer, process_group, no_dist):  # type: ignore[no-untyped-def]
        seen.append(("save", process_group, no_dist))
        return real_save(state, storage_writer=storage_writer, process_group=None, no_dist=no_dist)

    def load(state, *, storage_reader, process_group, no_dist):  # type: ignore[no-untyped-def]
        seen.append(("load", process_group, no_dist))
        return real_load(state, storage_reader=storage_reader, process_group=None, no_dist=no_dist)

    monkeypatch.setattr(dcp, "save", save)
    monkeypatch.setattr(dcp, "load", load)
    group = object()
    mgr = _manager(tmp_path, process_group=group)
    _save(mgr, 1)
    _save(mgr, 2, blocking=False)
    mgr.wait()
    assert _load(mgr) == (2, 2.0)
    assert seen == [("save", group, True), ("save", group, True), ("load", group, True)]
    mgr.close()


def test_the_manifest_records_the_step_and_the_defaults(tmp_path: Path) -> None:
    import time

    from trainyard.runtime.checkpoint import code_hash

    events: list = []
    mgr = _manager(tmp_path, events, world_size=1)
    assert mgr.last_save is None and mgr.wait() is None  # nothing in flight yet
    before = time.time()
    res = mgr.save(4, _state(4.0), {"rng": {"0": [1, 2]}}, blocking=True, emergency=True).result()
    after = time.time()
    step_dir = tmp_path / "job" / "step-4"
    man = json.loads((step_dir / MANIFEST).read_text())
    files = _step_files(step_dir)
    assert man["files"] == {n: {"sha256": d, "bytes": b} for n, (d, b) in files.items()}
    assert man["job_id"] == "job" and man["step"] == 4 and man["rng"] == {"0": [1, 2]}
    assert man["precision"] == {} and man["layout"] == {"format": "torch-dcp"}  # the defaults
    assert man["emergency"] is True and man["code_hash"] == code_hash()
    assert before <= man["created_time_s"] <= after
    assert res.emergency is True and res.step == 4 and res.url == mgr.step_url(4)
    assert res.files == man["files"] and res.bytes_written == sum(b for _, b in files.values())
    assert mgr.last_save is res
    assert 0 <= res.stage_s <= res.total_s
    ((_kind, data),) = [e for e in events if e[0] == "checkpoint"]
    assert data == {
        "step": 4,
        "path": mgr.step_url(4),
        "save_s": round(res.total_s, 6),
        "stall_s": round(res.stage_s, 6),
        "bytes": res.bytes_written,
        "emergency": True,
        "removed_steps": [],
    }
    # what the caller gives wins over the defaults
    mgr.save(
        5,
        _state(5.0),
        {"layout": {"format": "torch-dcp", "fsdp": 2}, "precision": {"name": "bf16"}},
        blocking=True,
    )
    man = json.loads((tmp_path / "job" / "step-5" / MANIFEST).read_text())
    assert man["layout"] == {"format": "torch-dcp", "fsdp": 2} and man["precision"] == {"name": "bf16"}
    assert man["emergency"] is False
    mgr.close()


def test_code_and_config_hashes() -> None:
    import hashlib

    import trainyard.runtime.checkpoint as ck
    from trainyard.runtime.checkpoint import code_hash, config_hash

    # the runtime's source files, in name order, each as its name then its bytes
    h = hashlib.sha256()
    for p in sorted(Path(ck.__file__).resolve().parent.glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    assert code_hash() == h.hexdigest()
    assert config_hash({"b": 1, "a": [1, "x"]}) == hashlib.sha256(b'{"a":[1,"x"],"b":1}').hexdigest()
    assert config_hash({"a": [1, "x"], "b": 1}) == config_hash({"b": 1, "a": [1, "x"]})


def test_a_rank_other_than_zero_writes_its_shards_and_leaves_the_commit_to_rank_zero(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events, rank=1)
    res = mgr.save(1, _state(1.0), {}, blocking=True).result()
    step_dir = tmp_path / "job" / "step-1"
    assert (step_dir / ".metadata").is_file() and not (step_dir / MANIFEST).exists()
    assert res.bytes_written == 0 and events == []
    assert mgr.latest_valid(report=False) is None
    mgr.close()


def test_keep_last_must_be_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^keep_last must be >= 1$"):
        _manager(tmp_path, keep_last=0)
    mgr = _manager(tmp_path, keep_last=1)
    for s in (1, 2):
        _save(mgr, s, loss=float(s))
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["step-1", "step-2"]  # 1 is the best
    mgr.close()


def test_the_commit_delay_drill_waits_before_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainyard.runtime.checkpoint as ck

    slept: list[float] = []

    class Clock:
        perf_counter = staticmethod(ck.time.perf_counter)
        time = staticmethod(ck.time.time)

        @staticmethod
        def sleep(s: float) -> None:
            slept.append(s)

    monkeypatch.setattr(ck, "time", Clock)
    _save(_manager(tmp_path / "a"), 1)
    assert slept == []  # no drill, no wait
    monkeypatch.setenv("TRAINYARD_CHECKPOINT_COMMIT_DELAY_S", "0.25")
    mgr = _manager(tmp_path / "b")
    assert mgr.commit_delay_s == 0.25
    _save(mgr, 1)
    assert slept == [0.25]
    monkeypatch.setenv("TRAINYARD_CHECKPOINT_COMMIT_DELAY_S", "")
    assert _manager(tmp_path / "c").commit_delay_s == 0.0


def test_a_commit_that_fails_leaves_the_step_torn_and_the_previous_one_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainyard.runtime.checkpoint as ck

    mgr = _manager(tmp_path)
    _save(mgr, 1)

    def full(fs, path, data):  # type: ignore[no-untyped-def]
        Path(f"{path}.tmp-1").write_bytes(data[:5])  # the temp file of the manifest, never renamed
        raise OSError("No space left on device")

    monkeypatch.setattr(ck, "atomic_write_bytes", full)
    url = mgr.step_url(2)
    with pytest.raises(CheckpointWriteError, match=f"^committing {url}/manifest.json failed: No space left"):
        _save(mgr, 2)
    monkeypatch.undo()
    assert CheckpointManager.verify(url) == (
        False,
        "torn: no manifest.json (the write never committed)",
        None,
    )
    assert _load(mgr) == (1, 1.0)
    # written again, the leftover temp file of the manifest is neither listed nor in the way
    _save(mgr, 2)
    man = json.loads((tmp_path / "job" / "step-2" / MANIFEST).read_text())
    assert (
        "manifest.json.tmp-1" not in man["files"]
        and (tmp_path / "job" / "step-2" / "manifest.json.tmp-1").exists()
    )
    assert CheckpointManager.verify(url)[:2] == (True, "ok")
    mgr.close()


def test_the_commit_trusts_the_hashes_taken_while_writing_only_at_the_same_size(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    res = mgr.save(9, _state(1.0), {}, blocking=True).result()  # any result object to fill
    step_dir = tmp_path / "job" / "step-1"
    step_dir.mkdir(parents=True)
    url = f"file://{step_dir}"
    with pytest.raises(CheckpointWriteError, match=f"^{url} holds no shard files after the save$"):
        mgr._commit(url, 1, {}, res)
    (step_dir / "a.bin").write_bytes(b"12345")
    (step_dir / "b.bin").write_bytes(b"123")
    (step_dir / "c.bin").write_bytes(b"1234")
    real = _step_files(step_dir)
    written = {
        str(step_dir / "a.bin"): ("f" * 64, 5),
        str(step_dir / "b.bin"): ("e" * 64, 4),
        f"file://{step_dir}/c.bin": ("d" * 64, 4),
    }
    mgr._commit(url, 1, {"layout": {"format": "raw"}}, res, written=written)
    man = json.loads((step_dir / MANIFEST).read_text())
    # a.bin, c.bin: the digest taken while writing (not read back); b.bin: its size differs, so it is re-read
    assert man["files"] == {
        "a.bin": {"sha256": "f" * 64, "bytes": 5},
        "b.bin": {"sha256": real["b.bin"][0], "bytes": 3},
        "c.bin": {"sha256": "d" * 64, "bytes": 4},
    }
    assert res.bytes_written == 12
    (step_dir / "b.bin").rename(step_dir / "XXb.bin")  # any name verifies, as the commit listed it
    man["files"]["XXb.bin"] = man["files"].pop("b.bin")
    man["files"]["a.bin"]["sha256"] = real["a.bin"][0]
    man["files"]["c.bin"]["sha256"] = real["c.bin"][0]
    (step_dir / MANIFEST).write_text(json.dumps(man))
    assert CheckpointManager.verify(url)[:2] == (True, "ok")
    mgr.close()


def test_the_step_directory_entry_is_made_durable_at_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainyard.runtime.checkpoint as ck

    dirs: list[str] = []
    monkeypatch.setattr(ck, "fsync_dir", dirs.append)
    mgr = _manager(tmp_path)
    _save(mgr, 1)
    assert dirs == [str(tmp_path / "job")]
    mgr.close()


def test_the_stall_of_an_async_save_adds_the_wait_for_staging_to_the_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What training waited: the save's own setup, then (overlapping staging) the wait in wait_staged.
    A clock that moves 0.25 s at every reading makes both 0.25 s."""
    import threading
    import time as real_time

    from trainyard.runtime import checkpoint

    readings: list[float] = []

    class Clock:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(real_time, name)

        def perf_counter(self) -> float:
            readings.append(100.0 + 0.25 * len(readings))
            return readings[-1]

    monkeypatch.setattr(checkpoint, "time", Clock())
    mgr = _manager(tmp_path)
    entered, release, waited = threading.Event(), threading.Event(), threading.Event()
    real_stage, real_commit = mgr._stager.stage, mgr._commit

    def stage(state):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(60)
        return real_stage(state)

    def commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert waited.wait(60)  # the trainer's wait is counted before the result is made
        return real_commit(*args, **kwargs)

    mgr._stager.stage = stage  # type: ignore[method-assign]
    mgr._commit = commit  # type: ignore[method-assign]
    mgr.save(3, _state(3.0), {}, overlap_staging=True)  # readings 0 and 1: a setup of 0.25 s
    assert entered.wait(60)

    def wait_staged() -> None:
        mgr.wait_staged()  # readings 2 and 3: a wait of 0.25 s
        waited.set()

    waiter = threading.Thread(target=wait_staged)
    waiter.start()
    deadline = real_time.monotonic() + 60
    while len(readings) < 3:  # the waiter is in wait_staged, blocked on the copy
        assert real_time.monotonic() < deadline
        real_time.sleep(0.001)
    release.set()
    waiter.join(60)
    res = mgr.wait()
    assert res is not None and res.stage_s == 0.5


def test_an_async_save_returns_once_staged_and_overlap_staging_waits_in_wait_staged(tmp_path: Path) -> None:
    import threading

    mgr = _manager(tmp_path)
    entered, release = threading.Event(), threading.Event()
    real_stage = mgr._stager.stage

    def stage(state):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(60)
        return real_stage(state)

    mgr._stager.stage = stage  # type: ignore[method-assign]
    state = _state(3.0)
    fut = mgr.save(3, state, {}, overlap_staging=True)
    assert entered.wait(60) and not fut.done() and mgr.save_in_flight
    waiter = threading.Thread(target=mgr.wait_staged)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # wait_staged blocks while the copy is being made
    release.set()
    waiter.join(60)
    assert not waiter.is_alive()
    state["model"]["w"].fill_(-1.0)  # after wait_staged the trainer may update its parameters
    res = mgr.wait()
    assert res is not None and res.step == 3 and not mgr.save_in_flight and mgr.wait() is None
    assert _load(mgr) == (3, 3.0)
    # without overlap_staging (the default), save() itself returns only after the copy
    entered.clear()
    release.clear()
    state = _state(4.0)
    saver = threading.Thread(target=mgr.save, args=(4, state, {}))
    saver.start()
    assert entered.wait(60)
    saver.join(0.5)
    assert saver.is_alive()  # save blocks while the copy is being made
    release.set()
    saver.join(60)
    assert not saver.is_alive()
    state["model"]["w"].fill_(-1.0)
    mgr.wait()
    assert _load(mgr) == (4, 4.0)
    mgr.close()


def test_the_save_reports_the_time_training_waited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainyard.runtime.checkpoint as ck

    ticks = itertools.count(100)

    class Clock:  # every reading of the clock is one second after the last
        time = staticmethod(ck.time.time)
        sleep = staticmethod(ck.time.sleep)

        @staticmethod
        def perf_counter() -> float:
            return float(next(ticks))

    monkeypatch.setattr(ck, "time", Clock)
    mgr = _manager(tmp_path)
    # blocking: t0=100, written at 101 (stall 1 s), committed at 102 (total 2 s)
    res = mgr.save(1, _state(1.0), {}, blocking=True).result()
    assert (res.stage_s, res.total_s) == (1.0, 2.0)
    mgr.close()


def test_by_default_the_last_three_steps_are_kept(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, keep_best=False)
    for step in range(1, 6):
        _save(mgr, step)
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["step-3", "step-4", "step-5"]


def test_retention_with_ties_unknown_losses_torn_steps_and_keep_best_off(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path / "a", events, keep_last=1)
    # equal losses: the newer of the two is the best
    for step, loss in ((1, 1.0), (2, 1.0), (3, 5.0)):
        _save(mgr, step, loss=loss)
    assert sorted(p.name for p in (tmp_path / "a" / "job").iterdir()) == ["step-2", "step-3"]
    # a step without a numeric loss is never the best
    mgr = _manager(tmp_path / "b", keep_last=1)
    _save(mgr, 1, loss=2.0)
    _save(mgr, 2)
    _save(mgr, 3)
    assert sorted(p.name for p in (tmp_path / "b" / "job").iterdir()) == ["step-1", "step-3"]
    # keep_best off: only the last
    mgr = _manager(tmp_path / "c", keep_last=1, keep_best=False)
    _save(mgr, 1, loss=1.0)
    _save(mgr, 2, loss=5.0)
    assert sorted(p.name for p in (tmp_path / "c" / "job").iterdir()) == ["step-2"]
    # older torn steps go, the step being written (no manifest yet) and newer ones stay; sorted in the event
    events.clear()
    mgr = _manager(tmp_path / "d", events, keep_last=1, keep_best=False)
    _save(mgr, 2)
    os.makedirs(tmp_path / "d" / "job" / "step-1")
    os.makedirs(tmp_path / "d" / "job" / "step-9")
    _save(mgr, 3)
    ck = [d for k, d in events if k == "checkpoint"]
    assert ck[-1]["removed_steps"] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "d" / "job").iterdir()) == ["step-3", "step-9"]
    os.makedirs(tmp_path / "d" / "job" / "step-4")
    assert mgr.apply_retention(current_step=4) == []
    assert (tmp_path / "d" / "job" / "step-4").is_dir()
    mgr.close()


def test_retention_of_a_save_to_the_fallback_root_applies_there(tmp_path: Path) -> None:
    mgr = _manager(
        tmp_path / "primary", keep_last=1, keep_best=False, fallback_url=f"file://{tmp_path / 'fb'}"
    )
    _save(mgr, 1)
    for step in (2, 3):
        mgr.save(step, _state(float(step)), {}, blocking=True, emergency=True, root=mgr.fallback_job_url)
    assert [p.name for p in (tmp_path / "fb" / "job").iterdir()] == ["step-3"]
    assert [p.name for p in (tmp_path / "primary" / "job").iterdir()] == ["step-1"]
    assert mgr.roots() == [mgr.job_url, f"file://{tmp_path / 'fb'}/job"]
    assert _manager(tmp_path / "x").roots() == [f"file://{tmp_path / 'x'}/job"]
    mgr.close()


def test_the_primary_root_wins_a_tie_with_the_fallback(tmp_path: Path) -> None:
    mgr = _manager(tmp_path / "primary", fallback_url=f"file://{tmp_path / 'fb'}")
    mgr.save(1, _state(1.0), {}, blocking=True, root=mgr.fallback_job_url)
    _save(mgr, 1)
    ref = mgr.latest_valid()
    assert ref is not None and ref.url == mgr.step_url(1) and ref.world_size == 1
    mgr.close()


def test_skipped_and_removed_steps_are_reported_as_events(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)
    (tmp_path / "job" / "step-2" / MANIFEST).unlink()
    why = "torn: no manifest.json (the write never committed)"
    assert mgr.latest_valid(report=False) is not None and events[-1][0] == "checkpoint"  # nothing reported
    mgr.latest_valid()
    assert events[-1] == (
        "log",
        {
            "message": f"skipping checkpoint step 2: {why}",
            "skipped_step": 2,
            "why": why,
            "path": mgr.step_url(2),
        },
    )
    mgr.remove_newer_than(1)
    assert events[-1] == (
        "log",
        {"message": "removed unusable checkpoint directory step-2", "removed_step": 2},
    )
    mgr.close()


def test_committed_lists_the_steps_with_a_readable_manifest_newest_first(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, keep_last=5)
    assert mgr.committed() == [] and mgr.latest_valid() is None  # no job directory yet
    for s in (1, 2, 3, 10):
        _save(mgr, s)
    (tmp_path / "job" / "step-2" / MANIFEST).unlink()
    (tmp_path / "job" / "step-3" / MANIFEST).write_text("[1, 2]")  # JSON, but not a manifest
    refs = mgr.committed()
    assert [(r.step, r.url) for r in refs] == [(10, mgr.step_url(10)), (1, mgr.step_url(1))]
    assert refs[0].manifest["step"] == 10
    mgr.close()


def test_only_step_directories_are_listed_in_numeric_order(tmp_path: Path) -> None:
    job = tmp_path / "job"
    steps = ("step-2", "step-10", "step-9")
    for name in (*steps, "quarantined-step-3-17", "step-x", "step-5.tmp", "xstep-4", "step-7X"):
        (job / name).mkdir(parents=True)
    url = f"file://{job}"
    assert CheckpointManager.list_step_dirs(url) == [
        (10, f"{url}/step-10"),
        (9, f"{url}/step-9"),
        (2, f"{url}/step-2"),
    ]
    assert CheckpointManager.list_step_dirs(f"file://{tmp_path / 'none'}") == []
    (tmp_path / "afile").write_text("x")
    assert CheckpointManager.list_step_dirs(f"file://{tmp_path / 'afile'}") == []


def test_steps_are_listed_on_object_storage_and_where_directories_end_in_a_slash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fsspec's object stores and memory file system list entries as dicts by default, and some stores
    (HTTP listings among them) name a directory with a trailing slash: the steps are found either way."""
    import importlib

    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class SlashFS(MemoryFileSystem):
        """A memory store whose listings name directories with a trailing slash."""

        protocol = "slashmem"
        store: ClassVar[dict] = {}
        pseudo_dirs: ClassVar[list[str]] = [""]

        @classmethod
        def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
            return super()._strip_protocol(str(path).removeprefix("slashmem://"))

        def ls(self, path, detail=True, **kwargs):  # type: ignore[no-untyped-def]
            out = super().ls(path, detail=True, **kwargs)
            named = [dict(e, name=e["name"] + "/" if e["type"] == "directory" else e["name"]) for e in out]
            return named if detail else [e["name"] for e in named]

    # registered for this test only (fsspec has no way to unregister a protocol)
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "slashmem", SlashFS)
    mem = fsspec.filesystem("memory")
    slash = fsspec.filesystem("slashmem")
    try:
        for fs, proto in ((mem, "memory"), (slash, "slashmem")):
            for step in (3, 12):
                fs.pipe(f"/lsjob/step-{step}/manifest.json", b"{}")
            fs.pipe("/lsjob/notes/step-4", b"")
            assert CheckpointManager.list_step_dirs(f"{proto}:///lsjob") == [
                (12, f"{proto}:///lsjob/step-12"),
                (3, f"{proto}:///lsjob/step-3"),
            ], proto
    finally:
        if mem.exists("/lsjob"):
            mem.rm("/lsjob", recursive=True)
        SlashFS.store.clear()
        SlashFS.clear_instance_cache()


def test_verify_names_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    mgr = _manager(tmp_path)
    _save(mgr, 1)
    step = tmp_path / "job" / "step-1"
    url = mgr.step_url(1)
    good = json.loads((step / MANIFEST).read_text())

    def why(manifest: object) -> str:
        (step / MANIFEST).write_text(json.dumps(manifest))
        ok, text, _ = CheckpointManager.verify(url)
        assert ok is (text == "ok"), text
        return text

    assert why(good) == "ok"
    assert why([1]) == "corrupt: manifest.json is not valid JSON"
    (step / MANIFEST).write_text("{")
    assert CheckpointManager.verify(url) == (False, "corrupt: manifest.json is not valid JSON", None)
    partial = {k: v for k, v in good.items() if k not in ("job_id", "layout")}
    assert why(partial) == "corrupt: manifest lacks job_id, layout"
    assert (
        why({**good, "format": "trainyard-checkpoint/2"})
        == "unknown checkpoint format 'trainyard-checkpoint/2'"
    )
    (step / ".metadata").rename(tmp_path / "index")
    no_index = {k: v for k, v in good["files"].items() if k != ".metadata"}
    for layout in (None, {}, {"format": "torch-dcp"}):  # a torch-dcp checkpoint must list its index
        assert (
            why({**good, "layout": layout, "files": no_index})
            == "corrupt: the manifest does not list .metadata"
        )
    assert why({**good, "layout": {"format": "safetensors"}, "files": no_index}) == "ok"  # no index to check
    assert why({**good, "files": no_index}) == "corrupt: the manifest does not list .metadata"
    (tmp_path / "index").rename(step / ".metadata")
    assert why({**good, "files": no_index}) == "corrupt: .metadata is on disk but not in the manifest"
    shard = next(k for k in good["files"] if k.endswith(".distcp"))
    size = good["files"][shard]["bytes"]
    assert why({**good, "files": {**good["files"], shard: {**good["files"][shard], "bytes": size + 1}}}) == (
        f"corrupt: {shard} has {size} bytes, the manifest says {size + 1}"
    )
    assert why({**good, "files": {**good["files"], "gone.distcp": {"sha256": "0" * 64, "bytes": 1}}}) == (
        "corrupt: gone.distcp is missing"
    )
    # an index that cannot be read, even with its right hash
    (step / ".metadata").write_bytes(b"not an index")
    files = {
        **good["files"],
        ".metadata": {"sha256": hashlib.sha256(b"not an index").hexdigest(), "bytes": 12},
    }
    assert why({**good, "files": files}) == "corrupt: .metadata cannot be read"
    from trainyard.runtime.checkpoint import _dcp_shard_files

    assert _dcp_shard_files(url) is None

    def refuse(self, path):  # type: ignore[no-untyped-def]
        raise PermissionError(path)

    import fsspec.implementations.local as local

    monkeypatch.setattr(local.LocalFileSystem, "find", refuse)
    ok, text, manifest = CheckpointManager.verify(url)
    assert (ok, text, manifest) == (
        False,
        "unreadable: listing the step failed (PermissionError)",
        {**good, "files": files},
    )
    mgr.close()


def test_the_index_names_the_shards_it_refers_to(tmp_path: Path) -> None:
    from trainyard.runtime.checkpoint import _dcp_shard_files

    mgr = _manager(tmp_path, write_threads=2)
    _save(mgr, 1)
    assert _dcp_shard_files(mgr.step_url(1)) == {"__0_0.distcp", "__0_1.distcp"}
    mgr.close()


def test_quarantine_names_the_time_and_removes_a_step_it_cannot_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec.implementations.local as local

    import trainyard.runtime.checkpoint as ck

    events: list = []
    mgr = _manager(tmp_path, events)
    _save(mgr, 1)
    _save(mgr, 2)

    class Clock:
        perf_counter = staticmethod(ck.time.perf_counter)
        sleep = staticmethod(ck.time.sleep)

        @staticmethod
        def time() -> float:
            return 1700000000.1234

    monkeypatch.setattr(ck, "time", Clock)
    ref = mgr.latest_valid()
    assert ref is not None
    moved = mgr.quarantine(ref, "x" * 600)
    assert moved == f"file://{tmp_path}/job/quarantined-step-2-1700000000123"
    assert (tmp_path / "job" / "quarantined-step-2-1700000000123" / MANIFEST).is_file()
    assert events[-1] == (
        "log",
        {
            "message": f"quarantined checkpoint step 2: {'x' * 600}",
            "quarantined_step": 2,
            "why": "x" * 500,
            "path": moved,
        },
    )

    def cannot(self, *a, **kw):  # type: ignore[no-untyped-def]
        raise PermissionError("read-only")

    monkeypatch.setattr(local.LocalFileSystem, "mv", cannot)
    ref = mgr.latest_valid()
    assert ref is not None and ref.step == 1
    assert mgr.quarantine(ref, "bad") is None
    assert not (tmp_path / "job" / "step-1").exists()
    assert events[-1][1]["path"] == ref.url
    mgr.close()


def test_a_step_is_uncommitted_before_its_files_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec.implementations.local as local

    mgr = _manager(tmp_path)
    _save(mgr, 1)
    real_rm = local.LocalFileSystem.rm

    def rm(self, path, recursive=False, **kw):  # type: ignore[no-untyped-def]
        if recursive:
            raise PermissionError("stopped half-way")
        return real_rm(self, path, recursive=recursive, **kw)

    monkeypatch.setattr(local.LocalFileSystem, "rm", rm)
    fs = local.LocalFileSystem()
    with pytest.raises(PermissionError):
        CheckpointManager._delete_step(fs, mgr.step_url(1))
    assert CheckpointManager.verify(mgr.step_url(1))[1].startswith("torn")  # never loadable again
    monkeypatch.undo()
    CheckpointManager._delete_step(fs, mgr.step_url(1))
    assert not (tmp_path / "job" / "step-1").exists()
    CheckpointManager._delete_step(fs, mgr.step_url(1))  # already gone: nothing to do
    mgr.close()


def test_write_errors_name_the_step_and_the_cause(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "step-2").write_text("a file")
    with pytest.raises(CheckpointWriteError, match=f"^cannot create {mgr.step_url(2)}: FileExistsError: "):
        _save(mgr, 2)
    (tmp_path / "job" / "step-3" / ".metadata.tmp").mkdir(parents=True)
    with pytest.raises(
        CheckpointWriteError, match=f"^writing {mgr.step_url(3)} failed: CheckpointException: "
    ):
        _save(mgr, 3)
    (tmp_path / "job" / "step-4" / ".metadata.tmp").mkdir(parents=True)
    with pytest.raises(
        CheckpointWriteError, match=f"^writing {mgr.step_url(4)} failed: CheckpointException: "
    ):
        _save(mgr, 4, blocking=False)
        mgr.wait()
    mgr.close()


def test_root_cause_names_the_innermost_error_and_the_first_line() -> None:
    from trainyard.runtime.checkpoint import _root_cause

    assert _root_cause(ValueError("bad value\nsecond line")) == "ValueError: bad value"
    assert _root_cause(ValueError()) == "ValueError: ValueError"

    def fail() -> None:
        try:
            try:
                raise FileNotFoundError("no such file")
            except FileNotFoundError as inner:
                raise OSError("middle") from inner  # an explicit cause
        except OSError:
            raise RuntimeError("  outer\nmore")  # noqa: B904 (an implicit context)

    with pytest.raises(RuntimeError) as info:
        fail()
    assert _root_cause(info.value) == "FileNotFoundError: no such file (outer)"


def test_a_stray_file_is_found_wherever_the_storage_lies(tmp_path: Path) -> None:
    """Only the manifest and the temporary files of its atomic write are exempt from the manifest, named
    within the step: storage under a directory whose name holds ``.tmp-`` or ends in ``manifest.json``
    still has every other file checked."""
    for root in (tmp_path / "x.tmp-1", tmp_path / "old-manifest.json"):
        mgr = _manager(root)
        _save(mgr, 1)
        step = root / "job" / "step-1"
        (step / "manifest.json.tmp-77").write_text("a torn commit's temporary file")
        assert CheckpointManager.verify(mgr.step_url(1))[:2] == (True, "ok")
        (step / "__1_0.distcp").write_bytes(b"stray")
        ok, why, _ = CheckpointManager.verify(mgr.step_url(1))
        assert not ok and why == "corrupt: __1_0.distcp is on disk but not in the manifest", root
        mgr.close()


def test_quarantine_moves_the_whole_step_on_any_file_system(tmp_path: Path) -> None:
    """On object storage a directory is its keys: the step is moved with all of them."""
    import fsspec

    from trainyard.runtime.checkpoint import CheckpointRef

    fs = fsspec.filesystem("memory")
    fs.pipe("/qjob/step-2/manifest.json", b"{}")
    fs.pipe("/qjob/step-2/__0_0.distcp", b"x")
    mgr = _manager(tmp_path)
    try:
        moved = mgr.quarantine(CheckpointRef(2, "memory:///qjob/step-2", {}), "bad")
        assert moved is not None and moved.startswith("memory:///qjob/quarantined-step-2-")
        where = moved.removeprefix("memory://")
        assert fs.cat(f"{where}/__0_0.distcp") == b"x" and not fs.exists("/qjob/step-2")
    finally:
        fs.rm("/qjob", recursive=True)
        mgr.close()


def test_retention_deletes_a_step_whose_manifest_cannot_be_read_and_goes_on_past_it(tmp_path: Path) -> None:
    """Newest first: step 40's manifest is not JSON. It is torn (older than the current step), so it goes,
    and the older steps behind it are still sorted: the last two readable ones stay, the rest go."""
    mgr = _manager(tmp_path, keep_last=10)
    for step in (10, 20, 30, 40, 50):
        _save(mgr, step)
    mgr.close()
    (tmp_path / "job" / "step-40" / MANIFEST).write_text("{not json")
    mgr = _manager(tmp_path, keep_last=2, keep_best=False)
    assert sorted(mgr.apply_retention(current_step=50)) == [10, 20, 40]
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["step-30", "step-50"]
    mgr.close()


def test_a_retention_that_fails_does_not_fail_the_committed_save(tmp_path: Path) -> None:
    events: list = []
    mgr = _manager(tmp_path, events)

    def failing(**kw: object) -> list[int]:
        raise OSError("the storage refused the delete")

    mgr.apply_retention = failing  # type: ignore[method-assign]
    _save(mgr, 1)
    (ck,) = [d for k, d in events if k == "checkpoint"]
    assert ck["step"] == 1 and ck["removed_steps"] == []
    assert _load(mgr) == (1, 1.0)
    mgr.close()
