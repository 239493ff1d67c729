"""Dataset storage on S3 (s3fs) against a real S3-compatible server started here on 127.0.0.1 (moto's
server mode): upload through the API, the version's files land in the bucket, rows and the runtime's
reader come back from it with matching sha256s."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from controlplane_support import free_port
from trainyard.api.app import create_app
from trainyard.runtime.data import read_split
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings

BUCKET = "trainyard-test"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the moto S3 server exited with {proc.returncode}")
            try:
                httpx.get(url, timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    pytest.fail("the moto S3 server did not start in 90 s")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import s3fs

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
    }.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    yield s3_endpoint
    s3fs.S3FileSystem.clear_instance_cache()


def test_s3_round_trip(s3_env: str, tmp_path: Path) -> None:
    import s3fs

    settings = Settings(home=tmp_path / "home", storage_url=f"s3://{BUCKET}/root")
    platform = Platform.open(settings, PlatformOptions(cpu_count=2))
    try:
        with TestClient(create_app(platform, access_log=False)) as c:
            h = {"Authorization": f"Bearer {settings.api_key_path.read_text().strip()}"}
            rows = [
                {
                    "messages": [
                        {"role": "user", "content": f"hi {i}"},
                        {"role": "assistant", "content": f"yo {i}"},
                    ]
                }
                for i in range(50)
            ]
            body = "".join(json.dumps(r) + "\n" for r in rows).encode()
            r = c.post(
                "/v1/datasets", params={"name": "on-s3", "eval_fraction": 0.2}, content=body, headers=h
            )
            assert r.status_code == 201, r.text
            doc = r.json()
            fs = s3fs.S3FileSystem()
            stored = fs.find(f"{BUCKET}/root/tenants/default/datasets")
            assert sorted(Path(p).name for p in stored) == ["eval.jsonl", "manifest.json", "train.jsonl"]
            train_key = next(p for p in stored if p.endswith("train.jsonl"))
            assert hashlib.sha256(fs.cat_file(train_key)).hexdigest() == doc["splits"]["train"]["sha256"]
            page = c.get(
                "/v1/datasets/on-s3@1/rows", params={"split": "eval", "limit": 1000}, headers=h
            ).json()
            assert len(page["rows"]) == doc["splits"]["eval"]["rows"]

            version = platform.datasets.resolve(
                platform.tenants.authenticate(h["Authorization"][7:]), doc["id"]
            )
            assert version.train.url.startswith(f"s3://{BUCKET}/root/tenants/default/datasets/")
            manifest = version.runtime_manifest()
            train = read_split(manifest, "train")  # the runtime's reader, sha256-checked
            evals = read_split(manifest, "eval")
            assert len(train) + len(evals) == 50
            # a tampered object is refused by the reader
            fs.pipe_file(train_key, fs.cat_file(train_key) + b'{"messages": []}\n')
            from trainyard.runtime.data import DataError

            with pytest.raises(DataError, match="sha256"):
                read_split(manifest, "train")
    finally:
        platform.close()
