"""kill -9 the real server mid-stream of submissions; on restart every acknowledged submission exists
exactly once, and resending every key (acknowledged or not) creates no duplicate."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from controlplane_support import ServerProcess, database_url, tiny_spec

WRITERS = 4
ACKED_BEFORE_KILL = 60


def _all_jobs(c: httpx.Client) -> list[dict]:
    out, cursor = [], None
    while True:
        params: dict = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = c.get("/v1/jobs", params=params).json()
        out += page["jobs"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_kill9_mid_stream_loses_and_duplicates_nothing(kind: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with database_url(kind, tmp_path) as url:
        srv = ServerProcess(home, database_url=url).start()
        auth = {"Authorization": f"Bearer {srv.api_key}"}
        acked: dict[str, str] = {}
        sent: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()
        unexpected: list[str] = []

        def writer(w: int) -> None:
            with httpx.Client(base_url=srv.url, headers=auth, timeout=10) as c:
                i = 0
                while not stop.is_set():
                    key = f"w{w}-{i}"
                    i += 1
                    with lock:
                        sent.append(key)
                    try:
                        r = c.post(
                            "/v1/jobs",
                            json={"spec": tiny_spec(f"crash-{key}")},
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.HTTPError:
                        return  # the server died under us: this one was never acknowledged
                    if r.status_code == 201:
                        with lock:
                            acked[key] = r.json()["id"]
                    else:
                        unexpected.append(f"{r.status_code} {r.text[:200]}")

        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(WRITERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acked) < ACKED_BEFORE_KILL and time.monotonic() < deadline:
            time.sleep(0.01)
        srv.kill9()  # mid-stream: writers are still sending
        stop.set()
        for t in threads:
            t.join(15)
        assert not unexpected, unexpected
        assert len(acked) >= ACKED_BEFORE_KILL, srv.log_text()
        acked_snapshot = dict(acked)

        srv2 = ServerProcess(home, database_url=url).start()
        try:
            with httpx.Client(base_url=srv2.url, headers=auth, timeout=10) as c:
                jobs = _all_jobs(c)
                by_id = {j["id"]: j for j in jobs}
                names = Counter(j["name"] for j in jobs)
                for key, job_id in acked_snapshot.items():
                    assert job_id in by_id, f"acknowledged submission {key} ({job_id}) lost"
                    assert by_id[job_id]["name"] == f"crash-{key}"
                assert all(n == 1 for n in names.values()), [n for n, k in names.items() if k > 1]
                # nothing but what the clients sent: every stored job is one of their submissions
                strangers = set(names) - {f"crash-{key}" for key in sent}
                assert not strangers, strangers
                # clients retry everything they are unsure about with the same keys: no duplicates
                for key in sent:
                    r = c.post(
                        "/v1/jobs", json={"spec": tiny_spec(f"crash-{key}")}, headers={"Idempotency-Key": key}
                    )
                    assert r.status_code in (200, 201), r.text
                    if key in acked_snapshot:
                        assert r.status_code == 200 and r.json()["id"] == acked_snapshot[key]
                final = _all_jobs(c)
                assert len(final) == len(set(sent))
                assert len({j["id"] for j in final}) == len(final)
        finally:
            assert srv2.stop() == 0, srv2.log_text()
