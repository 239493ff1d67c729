"""Storage GB-hours: each interval is billed once, whatever the tick times, repeats and restarts."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from service_support import Clock, sqlite_template
from sqlalchemy import Connection, Table, insert, select, update

from trainyard.services.domain import Job
from trainyard.services.lifecycle import JobState
from trainyard.store.datasets_models import DatasetVersionRow
from trainyard.store.db import Database
from trainyard.store.governance_models import BudgetRow, GovernanceEventRow, LedgerEntryRow
from trainyard.store.models import JobRow
from trainyard.store.registry_models import ModelVersionRow
from trainyard.store.repositories import job_insert_params
from trainyard.tenancy import ledger
from trainyard.tenancy.storage_meter import (
    MAX_BACKFILL_INTERVALS,
    StorageMeter,
    StoredResource,
    accruals,
    accrue,
    billed_until_s,
    last_boundary_s,
    stored_resources,
    usd_per_gb_hour,
)

T0 = 1_800_000_000.0


def _run(
    resources: list[StoredResource], ticks: list[float], interval_s: float, stale: set[int]
) -> dict[str, float]:
    """A ledger (source key -> GB-hours) after ticks at the given times. The watermark is recomputed
    from the ledger at every tick (a restart keeps nothing else); a tick in ``stale`` uses the watermark
    as it was before the previous tick (a second process that read it concurrently)."""
    book: dict[str, float] = {}
    prev_mark: float | None = None
    for i, now in enumerate(ticks):
        mark = max((float(k.rsplit(":", 1)[1]) + interval_s for k in book), default=None)
        use = prev_mark if i in stale else mark
        for a in accruals(resources, after_s=use, now_s=now, interval_s=interval_s):
            book.setdefault(a.source_key, a.gb_hours)  # the unique source key refuses a second write
        prev_mark = mark
    return book


def _expected_gb_hours(r: StoredResource, until_s: float) -> float:
    end = until_s if r.removed_s is None else min(until_s, r.removed_s)
    return max(0.0, end - r.created_s) / 3600.0 * r.bytes / 1e9


resource_st = st.builds(
    lambda kind, i, size, created, life: StoredResource(
        kind, str(i), "t1", size, T0 + created, removed_s=None if life is None else T0 + created + life
    ),
    st.sampled_from(["dataset", "checkpoint", "model"]),
    st.integers(0, 10_000),
    st.integers(1, 5 * 10**9),
    st.floats(0, 20_000, allow_nan=False),
    st.one_of(st.none(), st.floats(1, 30_000, allow_nan=False)),
)


@settings(max_examples=200, deadline=None)
@given(
    resources=st.lists(resource_st, max_size=6, unique_by=lambda r: (r.kind, r.key)),
    # ticks within MAX_BACKFILL_INTERVALS of the shortest interval (744 × 60 s = 44,640 s): the backfill
    # limit on a ledger with no storage entries yet has a test of its own below
    offsets=st.lists(st.floats(0, 44_000, allow_nan=False), min_size=1, max_size=12),
    interval_s=st.sampled_from([60.0, 600.0, 3600.0]),
    stale=st.sets(st.integers(0, 11), max_size=4),
    data=st.data(),
)
def test_every_interval_is_billed_once_across_arbitrary_ticks_and_restarts(
    resources: list[StoredResource],
    offsets: list[float],
    interval_s: float,
    stale: set[int],
    data: st.DataObject,
) -> None:
    assert max(offsets) < MAX_BACKFILL_INTERVALS * 60.0  # inside the backfill window of every interval
    # ticks mostly move forward, may repeat and may go back a little (clock skew between processes)
    ticks = sorted(T0 + o for o in offsets)
    if data.draw(st.booleans()):
        ticks = [*ticks, ticks[-1], ticks[-1] - data.draw(st.floats(0, 5_000))]
    book = _run(resources, ticks, interval_s, stale)
    # everything up to the last complete interval of the latest tick is billed, nothing after it
    until = last_boundary_s(max(ticks), interval_s)
    for r in resources:
        got = sum(v for k, v in book.items() if k.startswith(f"storage:{r.kind}:{r.key}:"))
        assert math.isclose(got, _expected_gb_hours(r, until), rel_tol=1e-9, abs_tol=1e-12), (r, ticks)
    for k in book:
        start = float(k.rsplit(":", 1)[1])
        assert start + interval_s <= until


def test_a_hand_computed_day_of_a_dataset_and_a_removed_checkpoint() -> None:
    h = 3600.0
    ds = StoredResource("dataset", "1", "t1", 2 * 10**9, T0 + 0.5 * h)  # 2 GB from half past
    ck = StoredResource("checkpoint", "j:1:10", "t1", 10**9, T0, removed_s=T0 + 2.25 * h)  # 1 GB, 2.25 h
    got: dict[str, float] = {}
    for a in accruals([ds, ck], after_s=T0, now_s=T0 + 3.9 * h, interval_s=h):
        got[a.source_key] = a.gb_hours
    # three complete hours: the dataset 2 GB x 2.5 h, the checkpoint 1 GB x 2.25 h
    assert math.isclose(sum(v for k, v in got.items() if ":dataset:" in k), 5.0)
    assert math.isclose(sum(v for k, v in got.items() if ":checkpoint:" in k), 2.25)
    assert f"storage:checkpoint:j:1:10:{int(T0 + 2 * h)}" in got
    assert not any(k.endswith(str(int(T0 + 3 * h))) for k in got)  # the running hour waits
    # the default price: $0.023 per GB-month, 730 hours a month
    assert math.isclose(usd_per_gb_hour(0.023), 0.023 / 730)


def test_a_changed_interval_length_bills_every_second_once_under_new_keys() -> None:
    """Hourly billing up to T0 + 5 h, then two-hourly: the first new interval, [T0 + 4 h, T0 + 6 h),
    began before the last billed end; only its part after T0 + 5 h is charged, keyed by T0 + 5 h (its
    own start is the key of an hour billed already, which the ledger would refuse as a duplicate)."""
    h = 3600.0
    t0 = math.floor(T0 / (2 * h)) * 2 * h  # on both grids
    ds = StoredResource("dataset", "1", "t1", 10**9, t0)  # 1 GB
    hourly = list(accruals([ds], after_s=t0, now_s=t0 + 5 * h, interval_s=h))
    two_hourly = list(accruals([ds], after_s=t0 + 5 * h, now_s=t0 + 8.5 * h, interval_s=2 * h))
    assert [(a.interval_start_s - t0) / h for a in two_hourly] == [5.0, 6.0]
    assert [a.gb_hours for a in two_hourly] == pytest.approx([1.0, 2.0])
    keys = [a.source_key for a in hourly + two_hourly]
    assert len(set(keys)) == len(keys)  # no charge meets an earlier one's key
    assert sum(a.gb_hours for a in hourly + two_hourly) == pytest.approx(8.0)  # t0 .. t0 + 8 h, once


def test_the_first_tick_bills_at_most_the_backfill_window() -> None:
    old = StoredResource("dataset", "1", "t1", 10**9, T0 - 10 * 365 * 86400.0)
    got = list(accruals([old], after_s=None, now_s=T0, interval_s=3600.0))
    assert len(got) == MAX_BACKFILL_INTERVALS


# ---- what the store records, billed on a real SQLite file -------------------------------------------------
H = 3600.0
GB = 10**9
LEDGER = cast(Table, LedgerEntryRow.__table__)
EVENTS = cast(Table, GovernanceEventRow.__table__)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sqlite_template(
        tmp_path_factory.mktemp("storage_meter") / "template.sqlite", [("t1", "acme"), ("t2", "beta")]
    )


@pytest.fixture
def db(template: Path, tmp_path: Path) -> Iterator[Database]:
    shutil.copy(template, tmp_path / "db.sqlite")
    d = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield d
    d.dispose()


def _dataset(conn: Connection, tenant_id: str, size: int, created_s: float) -> int:
    row = {
        "tenant_id": tenant_id,
        "name": "d",
        "version": 1,
        "sha256": "0" * 64,
        "split_key": "k",
        "format": "jsonl",
        "rows": 1,
        "bytes": size,
        "duplicates_removed": 0,
        "eval_fraction": 0.1,
        "seed": 0,
        "tokenizer": "tok",
        "splits": {},
        "stats": {},
        "storage_url": "file:///d",
        "created_at_s": created_s,
    }
    table = cast(Table, DatasetVersionRow.__table__)
    return int(conn.execute(insert(table).values(**row).returning(table.c.seq)).scalar_one())


def _job(
    conn: Connection, job_id: str, tenant_id: str, spec: dict[str, Any] | None, checkpoints: Any
) -> None:
    job = Job(
        id=job_id,
        seq=0,
        tenant_id=tenant_id,
        name=job_id,
        state=JobState.RUNNING,
        spec={},
        created_at_s=0.0,
        updated_at_s=0.0,
    )
    jobs = cast(Table, JobRow.__table__)
    conn.execute(insert(jobs), job_insert_params(job))
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(spec=spec, checkpoints=checkpoints))


def _model(
    conn: Connection, tenant_id: str, name: str, version: int, doc: dict[str, Any], source_job: str | None
) -> int:
    table = cast(Table, ModelVersionRow.__table__)
    row = {
        "tenant_id": tenant_id,
        "name": name,
        "version": version,
        "kind": "full",
        "sha256": "0" * 64,
        "source_job": source_job,
        "datasets": [],
        "doc": doc,
        "created_by": "x",
        "created_at_s": T0 + 2 * H,
    }
    return int(conn.execute(insert(table).values(**row).returning(table.c.seq)).scalar_one())


def _store(db: Database) -> dict[str, int]:
    """Two tenants' datasets, a job's checkpoints (some not billable) and models."""
    with db.engine.begin() as c:
        ds = _dataset(c, "t1", 2 * GB, T0 + 0.5 * H)
        empty = _dataset(c, "t2", 0, T0)
        _job(
            c,
            "j1",
            "t1",
            {"tags": {"team": "x", "n": 5}},
            [
                {"attempt": 1, "step": 10, "bytes": GB, "time_s": T0, "removed_at_s": T0 + 2.25 * H},
                {"attempt": 2, "step": 30, "bytes": 1.5e9, "time_s": T0},  # a size that is no int
                {"attempt": 2, "step": 20, "bytes": GB // 2, "time_s": T0 + H, "removed_at_s": None},
                {"attempt": 2, "step": 40, "bytes": GB, "time_s": None},  # no time
                {"attempt": 2, "step": 50, "time_s": T0},  # no size
            ],
        )
        _job(c, "j2", "t2", None, None)
        m1 = _model(c, "t1", "m", 3, {"bytes": 3 * GB}, "j1")
        m2 = _model(c, "t2", "n", 1, {"bytes": GB}, None)
        _model(c, "t2", "n", 2, {"bytes": "1 GB"}, None)
        _model(c, "t2", "n", 3, {}, None)
        gone = _model(c, "t-gone", "g", 1, {"bytes": GB}, None)  # its tenant was removed
        unknown_job = _model(c, "t2", "u", 1, {"bytes": GB}, "j-gone")
    return {"ds": ds, "empty": empty, "m1": m1, "m2": m2, "gone": gone, "unknown_job": unknown_job}


def test_stored_resources_are_what_the_store_records_with_a_size(db: Database) -> None:
    ids = _store(db)
    tags = {"team": "x", "n": "5"}
    with db.engine.connect() as c:
        got = stored_resources(c)
    assert got == [
        StoredResource("dataset", str(ids["ds"]), "t1", 2 * GB, T0 + 0.5 * H),
        StoredResource("dataset", str(ids["empty"]), "t2", 0, T0),
        StoredResource(
            "checkpoint", "j1:1:10", "t1", GB, T0, removed_s=T0 + 2.25 * H, job_id="j1", tags=tags
        ),
        StoredResource("checkpoint", "j1:2:20", "t1", GB // 2, T0 + H, job_id="j1", tags=tags),
        StoredResource(
            "model", str(ids["m1"]), "t1", 3 * GB, T0 + 2 * H, job_id="j1", model="m@3", tags=tags
        ),
        StoredResource("model", str(ids["m2"]), "t2", GB, T0 + 2 * H, model="n@1"),
        StoredResource("model", str(ids["gone"]), "t-gone", GB, T0 + 2 * H, model="g@1"),
        StoredResource("model", str(ids["unknown_job"]), "t2", GB, T0 + 2 * H, job_id="j-gone", model="u@1"),
    ]
    assert all(type(r.bytes) is int and type(r.created_s) is float for r in got)
    assert type(got[2].removed_s) is float


def _entries(db: Database) -> dict[str, dict[str, Any]]:
    with db.engine.connect() as c:
        return {r.source_key: dict(r._mapping) for r in c.execute(select(LEDGER).order_by(LEDGER.c.id))}


def test_accrue_bills_each_complete_interval_once_with_every_field(db: Database) -> None:
    ids = _store(db)
    price = 0.073  # $ per GB-month: 0.0001 per GB-hour
    unit = price / 730.0
    with db.engine.begin() as c:
        assert billed_until_s(c) is None
        # a device charge later than any storage entry is not a storage watermark
        ledger.charge(
            c,
            ledger.Charge("dev:1", "t1", ledger.KIND_DEVICE, 1.0, "device_hours", 1.0, 0.0, T0 + 100 * H),
        )
        assert billed_until_s(c) is None
        n = accrue(c, now_s=T0 + 2.5 * H, interval_s=H, price_usd_per_gb_month=price)
    got = _entries(db)
    storage = {k: v for k, v in got.items() if k.startswith("storage:")}
    assert n == len(storage)
    # two complete hours: the dataset from half past the first, the first checkpoint both, the second
    # checkpoint the second hour; models are younger; the empty dataset accrues nothing
    expect = {
        f"storage:dataset:{ids['ds']}:{int(T0)}": (1.0, T0 + H, None, None, {}, "t1"),
        f"storage:dataset:{ids['ds']}:{int(T0 + H)}": (2.0, T0 + 2 * H, None, None, {}, "t1"),
        f"storage:checkpoint:j1:1:10:{int(T0)}": (1.0, T0 + H, "j1", None, {"team": "x", "n": "5"}, "t1"),
        f"storage:checkpoint:j1:1:10:{int(T0 + H)}": (
            1.0,
            T0 + 2 * H,
            "j1",
            None,
            {"team": "x", "n": "5"},
            "t1",
        ),
        f"storage:checkpoint:j1:2:20:{int(T0 + H)}": (
            0.5,
            T0 + 2 * H,
            "j1",
            None,
            {"team": "x", "n": "5"},
            "t1",
        ),
    }
    assert set(storage) == set(expect)
    for key, (gbh, time_s, job_id, model, tags, tenant) in expect.items():
        row = storage[key]
        assert math.isclose(row["quantity"], gbh)
        assert math.isclose(row["usd"], gbh * unit)
        assert math.isclose(row["unit_price_usd"], unit)
        assert (row["kind"], row["unit"], row["time_s"], row["job_id"], row["model"], row["tags"]) == (
            ledger.KIND_STORAGE,
            "gb_hours",
            time_s,
            job_id,
            model,
            tags,
        )
        assert row["tenant_id"] == tenant
    with db.engine.begin() as c:
        assert billed_until_s(c) == T0 + 2 * H
        assert accrue(c, now_s=T0 + 2.9 * H, interval_s=H, price_usd_per_gb_month=price) == 0  # nothing new
        assert accrue(c, now_s=T0 + 2 * H, interval_s=H, price_usd_per_gb_month=price) == 0
        n = accrue(c, now_s=T0 + 3 * H, interval_s=H, price_usd_per_gb_month=price)
    new = {k: v for k, v in _entries(db).items() if k not in got}
    # the third hour: the dataset, the first checkpoint's last quarter, the second checkpoint, and the
    # models of t1 and t2 (one of them names a job that is gone: no tags), not the removed tenant's
    assert n == len(new) == 6
    assert {k.rsplit(":", 1)[1] for k in new} == {str(int(T0 + 2 * H))}
    hour = int(T0 + 2 * H)
    assert {k: v["quantity"] for k, v in new.items() if ":model:" not in k} == {
        f"storage:dataset:{ids['ds']}:{hour}": 2.0,
        f"storage:checkpoint:j1:1:10:{hour}": 0.25,
        f"storage:checkpoint:j1:2:20:{hour}": 0.5,
    }
    assert new[f"storage:model:{ids['m2']}:{hour}"]["quantity"] == 1.0
    m1 = new[f"storage:model:{ids['m1']}:{int(T0 + 2 * H)}"]
    assert (m1["quantity"], m1["job_id"], m1["model"], m1["tags"]) == (
        3.0,
        "j1",
        "m@3",
        {"team": "x", "n": "5"},
    )
    u = new[f"storage:model:{ids['unknown_job']}:{int(T0 + 2 * H)}"]
    assert (u["tenant_id"], u["job_id"], u["model"], u["tags"]) == ("t2", "j-gone", "u@1", {})
    assert not any(k.startswith(f"storage:model:{ids['gone']}:") for k in _entries(db))
    with db.engine.begin() as c:
        assert billed_until_s(c) == T0 + 3 * H


def test_a_storage_charge_settles_the_budget_and_its_alert_names_the_tenant(db: Database) -> None:
    with db.engine.begin() as c:
        _dataset(c, "t1", 730 * GB, T0)  # 730 GB at $1 per GB-month: $1 an hour
        c.execute(
            insert(cast(Table, BudgetRow.__table__)),
            {
                "id": "b1",
                "tenant_id": "t1",
                "tag_key": "",
                "tag_value": "",
                "period": "month",
                "limit_usd": 2.0,
                "hard": False,
                "created_at_s": 0.0,
                "updated_at_s": 0.0,
            },
        )
        assert accrue(c, now_s=T0 + H, interval_s=H, price_usd_per_gb_month=1.0) == 1
        alerts = [(r.kind, r.data) for r in c.execute(select(EVENTS.c.kind, EVENTS.c.data))]
    assert [(k, d["tenant"], d["threshold_pct"]) for k, d in alerts] == [("budget_alert", "acme", 50)]


def test_the_meter_accrues_once_per_completed_interval_of_its_clock(db: Database) -> None:
    ids = _store(db)
    clock = Clock(T0 + 1.5 * H)
    meter = StorageMeter(db, clock=clock, interval_s=H, price_usd_per_gb_month=0.05)
    assert meter.tick() == 2  # the first hour: the dataset and the first checkpoint
    assert set(_entries(db)) == {
        f"storage:dataset:{ids['ds']}:{int(T0)}",
        f"storage:checkpoint:j1:1:10:{int(T0)}",
    }
    unit = _entries(db)[f"storage:dataset:{ids['ds']}:{int(T0)}"]["unit_price_usd"]
    assert math.isclose(unit, 0.05 / 730)

    class Away:
        def session(self) -> Any:
            raise AssertionError("the meter read the database within an interval it has billed")

    meter.db = Away()
    clock.now = T0 + 1.99 * H
    assert meter.tick() == 0
    clock.now = T0 + 2 * H  # the second hour is complete
    meter.db = db
    assert meter.tick() == 3
    meter.db = Away()
    assert meter.tick() == 0
    clock.now = T0 + 1.2 * H  # a clock that went back
    assert meter.tick() == 0
    # another process's meter, started afresh, finds the ledger's watermark and writes nothing twice
    other = StorageMeter(db, clock=Clock(T0 + 2.5 * H), interval_s=H, price_usd_per_gb_month=0.05)
    assert other.tick() == 0
    assert (other.interval_s, other.price, other.clock()) == (H, 0.05, T0 + 2.5 * H)


def test_after_an_outage_longer_than_the_backfill_window_every_interval_since_the_last_is_billed(
    db: Database,
) -> None:
    with db.engine.begin() as c:
        ds = _dataset(c, "t1", GB, T0 - 2 * H)
        assert accrue(c, now_s=T0 + H, interval_s=H, price_usd_per_gb_month=0.05) == 3
        # the control plane was down for 800 hours, longer than the 744 a first tick would bill
        assert accrue(c, now_s=T0 + 801 * H, interval_s=H, price_usd_per_gb_month=0.05) == 800
        assert billed_until_s(c) == T0 + 801 * H
    got = [k for k in _entries(db) if k.startswith(f"storage:dataset:{ds}:")]
    assert len(got) == 803 == len(set(got))
    assert f"storage:dataset:{ds}:{int(T0 + H)}" in got  # the first hour after the last one billed
