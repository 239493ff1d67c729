"""The Python client against a real `trainyard up` subprocess: typed documents (the API's own models),
spec objects, files and dicts, `wait()` with progress, pagination, errors, tenant walls, and the asyncio
twin doing the same."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from controlplane_support import ServerProcess, tiny_spec
from trainyard import errors as E
from trainyard.api_models import EventDoc, JobDocument, JobList, PlacementDoc, QuoteResponse
from trainyard.client import AsyncTrainyardClient, JobProgress, TrainyardClient
from trainyard.enums import JobState, Market
from trainyard.spec import load_spec, spec_from_dict


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("client-home"), executor="local").start()
    yield srv
    assert srv.stop() == 0, srv.log_text()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[TrainyardClient]:
    with TrainyardClient(server.url, server.api_key) as c:
        yield c


def _queued_spec(name: str) -> dict[str, object]:
    """A job that stays queued: only planning pools (the packaged cloud catalog) offer an H100."""
    spec = tiny_spec(name)
    spec["requirements"] = {"allow": ["h100"]}
    return spec


def test_documents_are_typed_and_read_like_the_json(client: TrainyardClient, server: ServerProcess) -> None:
    job = client.submit(_queued_spec("typed"))
    try:
        assert isinstance(job, JobDocument)
        assert isinstance(job.state, JobState) and job["state"] == job.state
        assert job.get("no-such-field", "x") == "x" and "id" in job and "no-such-field" not in job
        with pytest.raises(KeyError):
            job["no-such-field"]
        raw = httpx.get(
            f"{server.url}/v1/jobs/{job.id}", headers={"Authorization": f"Bearer {server.api_key}"}
        ).json()
        again = client.get_job(job.id)
        # to_dict() is exactly the server's JSON for fields both saw (the job moves on between calls)
        assert set(again.to_dict()) == set(raw)
        assert again.to_dict()["spec"] == raw["spec"] and again == again.to_dict()
    finally:
        client.cancel_job(job.id)


def test_submit_accepts_a_spec_object_a_dict_and_a_file(client: TrainyardClient, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_queued_spec("from-file")))
    by_file = client.submit(path)
    by_str = client.submit(str(path))
    by_object = client.submit(load_spec(path))
    by_dict = client.submit(_queued_spec("from-dict"))
    jobs = [by_file, by_str, by_object, by_dict]
    try:
        assert [j.name for j in jobs] == ["from-file", "from-file", "from-file", "from-dict"]
        assert len({j.id for j in jobs}) == 4
        assert all(j.state in (JobState.PENDING, JobState.QUEUED) for j in jobs)
        quote = client.quote(spec_from_dict(tiny_spec("q")))
        assert isinstance(quote, QuoteResponse) and quote.feasible()
        assert all(isinstance(o.market, Market) for o in quote.options)
    finally:
        for j in jobs:
            client.cancel_job(j.id)


def test_invalid_specs_list_every_error(client: TrainyardClient, tmp_path: Path) -> None:
    bad = tiny_spec("bad")
    bad["workload"] = {**bad["workload"], "seq_len": -1, "global_batch": 0}
    bad["nonsense"] = 1
    with pytest.raises(E.InvalidInputError) as server_side:
        client.submit(bad)
    assert len(server_side.value.details["errors"]) >= 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(E.SpecError) as local:
        client.submit(path)  # validated here, before anything is sent
    assert len(local.value.details["errors"]) >= 3
    with pytest.raises(E.InvalidInputError):
        client.submit(42)  # type: ignore[arg-type]


def test_wait_reports_progress_until_the_job_succeeds(client: TrainyardClient) -> None:
    job = client.submit(tiny_spec("progress", steps=12))
    seen: list[JobProgress] = []
    done = client.wait(job.id, timeout_s=300, poll_s=0.2, on_progress=seen.append)
    assert done.state == JobState.SUCCEEDED, done.reason
    assert done.done and isinstance(done.placement, PlacementDoc) and done.placement.pool == "local-cpu"
    assert seen[-1].state == JobState.SUCCEEDED and seen[-1].job.id == job.id
    states = [p.state for p in seen]
    assert JobState.RUNNING in states or JobState.STARTING in states
    steps = [p.step for p in seen if p.step is not None]
    assert steps == sorted(steps) and steps[-1] == 12 and seen[-1].total_steps == 12
    assert seen[-1].fraction == 1.0
    events = [e for p in seen for e in p.events]
    assert all(isinstance(e, EventDoc) for e in events)
    assert [e.id for e in events] == sorted({e.id for e in events})  # each event reported once, in order
    assert [e.data["to"] for e in events if e.kind == "state"][-1] == "succeeded"
    assert {e.id for e in events} == {e.id for e in client.iter_events(job.id, page_size=3)}


def test_wait_gives_up_after_its_timeout(client: TrainyardClient) -> None:
    job = client.submit(_queued_spec("stuck"))
    try:
        with pytest.raises(E.ServiceUnavailableError, match="still"):
            client.wait(job.id, timeout_s=1.0, poll_s=0.2)
    finally:
        client.cancel_job(job.id)


def test_pagination_iterates_every_page(client: TrainyardClient) -> None:
    jobs = [client.submit(_queued_spec(f"page-{i}")) for i in range(5)]
    try:
        first = client.list_jobs(name="page-1", limit=1)
        assert isinstance(first, JobList) and len(first.jobs) == 1
        mine = {j.id for j in jobs}
        listed = [j.id for j in client.iter_jobs(page_size=2) if j.id in mine]
        assert listed == [j.id for j in reversed(jobs)]  # newest first, each job once
        queued = {j.id for j in client.iter_jobs(states=["queued", "pending"], page_size=2)}
        assert mine <= queued
    finally:
        for j in jobs:
            client.cancel_job(j.id)
    cancelled = {j.id for j in client.iter_jobs(states=[JobState.CANCELLED], page_size=2)}
    assert mine <= cancelled


def test_errors_and_tenant_walls(client: TrainyardClient, server: ServerProcess) -> None:
    with pytest.raises(E.NotFoundError):
        client.get_job("job-000000000000")
    other = client.create_tenant("client-other")
    mine = client.submit(_queued_spec("walled"))
    try:
        with TrainyardClient(server.url, other.api_key) as theirs:
            with pytest.raises(E.NotFoundError):
                theirs.get_job(mine.id)
            assert mine.id not in {j.id for j in theirs.iter_jobs()}
        with TrainyardClient(server.url, "ty_nope_nope") as anonymous, pytest.raises(E.AuthenticationError):
            anonymous.list_jobs()
    finally:
        client.cancel_job(mine.id)
    down = TrainyardClient("http://127.0.0.1:9", "k", retries=1, backoff_s=0.01)
    with down, pytest.raises(E.ServiceUnavailableError, match="cannot reach"):
        down.healthz()


def test_async_client_is_the_same_api(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with AsyncTrainyardClient(server.url, server.api_key) as c:
            queued = await c.submit(spec_from_dict(_queued_spec("async-queued")))
            assert isinstance(queued, JobDocument)
            job = await c.submit(tiny_spec("async-run", steps=6))
            seen: list[JobProgress] = []

            async def on_progress(p: JobProgress) -> None:
                seen.append(p)

            done = await c.wait(job.id, timeout_s=300, poll_s=0.2, on_progress=on_progress)
            assert done.state == JobState.SUCCEEDED, done.reason
            assert seen[-1].step == 6 and seen[-1].done
            watched = [p async for p in c.watch(job.id)]
            assert len(watched) == 1 and watched[0].state == JobState.SUCCEEDED
            ids = [j.id async for j in c.iter_jobs(page_size=1)]
            assert ids.index(job.id) < ids.index(queued.id) and len(ids) == len(set(ids))  # newest first
            events = [e async for e in c.iter_events(job.id, page_size=2)]
            assert [e.id for e in events] == [e.id for e in (await c.get_job(job.id)).events]
            await c.cancel_job(queued.id)
            with pytest.raises(E.NotFoundError):
                await c.get_job("job-000000000000")

    asyncio.run(scenario())


def test_sync_and_async_clients_expose_the_same_methods() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            n: inspect.signature(f)
            for n, f in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_")
        }

    sync, aio = public(TrainyardClient), public(AsyncTrainyardClient)
    assert sync.keys() == aio.keys()
    for name, sig in sync.items():
        assert list(sig.parameters) == list(aio[name].parameters), name
        assert inspect.iscoroutinefunction(getattr(AsyncTrainyardClient, name)) or inspect.isasyncgenfunction(
            getattr(AsyncTrainyardClient, name)
        ), name
