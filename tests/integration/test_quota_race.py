"""The queued-jobs quota holds exactly under concurrent submissions (SQLite and PostgreSQL), and a resend
of an accepted submission answers the original job even at quota."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane_support import database_url, tiny_spec
from trainyard.errors import QuotaExceededError
from trainyard.services.domain import Principal
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings
from trainyard.spec import spec_from_dict
from trainyard.store.repositories import JobRepo

SUBMITTERS = 100


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def platform(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    home = tmp_path_factory.mktemp(f"quota-{request.param}")
    with database_url(request.param, home) as url:
        # the engine's pool lets 32 of the submitters be in the database at the same moment
        p = Platform.open(Settings(home=home, database_url=url), PlatformOptions(cpu_count=2))
        yield p
        p.close()


def _principal(platform: Platform, name: str, quota: int) -> Principal:
    _, key = platform.tenants.create(name, max_queued_jobs=quota)
    principal = platform.tenants.authenticate(key)
    assert principal.max_queued_jobs == quota
    return principal


def _storm(platform: Platform, principal: Principal, n: int) -> tuple[int, int, list[BaseException]]:
    spec = spec_from_dict(tiny_spec("storm"))
    barrier = threading.Barrier(n)
    admitted = refused = 0
    other: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        nonlocal admitted, refused
        barrier.wait()
        try:
            platform.jobs.submit(principal, spec)
        except QuotaExceededError:
            with lock:
                refused += 1
        except BaseException as exc:
            with lock:
                other.append(exc)
        else:
            with lock:
                admitted += 1

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return admitted, refused, other


@pytest.mark.parametrize("quota", [20, 1])
def test_concurrent_submissions_admit_exactly_the_quota(platform: Platform, quota: int) -> None:
    # PostgreSQL is where check-then-insert let 22-33 through: five storms there, one on SQLite
    rounds = 5 if platform.db.dialect == "postgresql" else 1
    for round_ in range(rounds):
        principal = _principal(platform, f"race-{quota}-{round_}", quota)
        admitted, refused, other = _storm(platform, principal, SUBMITTERS)
        assert other == []
        assert (round_, admitted, refused) == (round_, quota, SUBMITTERS - quota)
        with platform.db.session() as s:
            assert JobRepo(s).count(tenant_id=principal.tenant_id) == quota


def test_a_resend_at_quota_returns_the_original_job(platform: Platform, tmp_path: Path) -> None:
    principal = _principal(platform, "resend", 1)
    spec = spec_from_dict(tiny_spec("first"))
    job, created = platform.jobs.submit(principal, spec, idempotency_key="k-1")
    assert created
    with pytest.raises(QuotaExceededError):
        platform.jobs.submit(principal, spec_from_dict(tiny_spec("second")), idempotency_key="k-2")
    again, created = platform.jobs.submit(principal, spec, idempotency_key="k-1")
    assert (again.id, created) == (job.id, False)
