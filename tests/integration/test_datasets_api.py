"""/v1/datasets and data resolution at submission, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import database_url, tiny_spec
from trainyard.api.app import create_app
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.settings import Settings

MAX_BYTES = 200_000


class Api:
    def __init__(self, platform: Platform, client: TestClient, home: Path) -> None:
        self.platform = platform
        self.c = client
        self.home = home
        self.admin = {"Authorization": f"Bearer {platform.settings.api_key_path.read_text().strip()}"}
        r = client.post("/v1/tenants", json={"name": "ds-other"}, headers=self.admin)
        assert r.status_code == 201, r.text
        self.other = {"Authorization": f"Bearer {r.json()['api_key']}"}

    def upload(self, rows: list[Any], name: str, headers: dict[str, str] | None = None, **params: Any) -> Any:
        body = b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows)
        return self.c.post(
            "/v1/datasets",
            params={"name": name, **params},
            content=body,
            headers={**(headers or self.admin), "Content-Type": "application/x-ndjson"},
        )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp(f"ds-{request.param}")
    with database_url(request.param, home) as url:
        settings = Settings(home=home, database_url=url, dataset_max_bytes=MAX_BYTES)
        platform = Platform.open(settings, PlatformOptions(cpu_count=2))
        with TestClient(create_app(platform, access_log=False)) as client:
            yield Api(platform, client, home)
        platform.close()


def chats(n: int, tag: str = "") -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"{tag} question number {i} about topic {i * 7919 % 1000}"},
                {"role": "assistant", "content": f"answer {i}"},
            ]
        }
        for i in range(n)
    ]


def storage_files(api: Api, tenant: str) -> list[Path]:
    root = api.home / "storage" / "tenants" / tenant / "datasets"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize(
    ("fmt", "rows"),
    [
        ("text", ["line one", "line two", {"text": "json three"}]),
        ("completion", [{"prompt": f"{i}+{i}=", "completion": str(2 * i)} for i in range(40)]),
        ("chat", chats(40)),
    ],
)
def test_upload_each_format(api: Api, fmt: str, rows: list[Any]) -> None:
    r = api.upload(rows, f"fmt-{fmt}")
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["id"] == f"ds://fmt-{fmt}@1" and doc["format"] == fmt and doc["version"] == 1
    assert doc["rows"] == len(rows)
    sp = doc["splits"]
    assert sp["train"]["rows"] + sp["eval"]["rows"] == len(rows)
    assert set(doc) >= {"sha256", "bytes", "duplicates_removed", "derived_from", "created_at"}
    # the split hashes are the sha256sum of the stored files
    for side in ("train", "eval"):
        page = api.c.get(
            f"/v1/datasets/fmt-{fmt}@1/rows", params={"split": side, "limit": 1000}, headers=api.admin
        )
        assert page.status_code == 200
        assert len(page.json()["rows"]) == sp[side]["rows"]
    v = api.platform.datasets.resolve(
        api.platform.tenants.authenticate(api.admin["Authorization"][7:]), doc["id"]
    )
    import fsspec

    with fsspec.open(v.train.url, "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == sp["train"]["sha256"]


def test_invalid_upload_lists_every_bad_line_and_stores_nothing(api: Api) -> None:
    before = storage_files(api, "default")
    rows = [*chats(5), '{"messages": [', {"messages": [{"role": "bot", "content": "x"}]}, *chats(3, "b")]
    rows.append({"messages": [{"role": "user", "content": "no answer"}]})
    r = api.upload(rows, "broken")
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_dataset"
    assert [(e["line"], e["kind"]) for e in err["details"]["errors"]] == [
        (6, "bad_json"),
        (7, "unknown_role"),
        (11, "no_assistant_turn"),
    ]
    assert api.c.get("/v1/datasets", params={"name": "broken"}, headers=api.admin).json() == {"datasets": []}
    assert storage_files(api, "default") == before
    assert not list((api.home / "tmp" / "uploads").glob("*"))


def test_identical_reupload_returns_the_version_and_a_resplit_is_derived(api: Api) -> None:
    rows = chats(60, "dup")
    first = api.upload(rows, "stable")
    assert first.status_code == 201
    again = api.upload(list(reversed(rows)) + rows[:5], "stable")
    assert again.status_code == 200 and again.json()["id"] == "ds://stable@1"
    resplit = api.upload(rows, "stable", eval_fraction=0.3)
    assert resplit.status_code == 201, resplit.text
    doc = resplit.json()
    assert doc["id"] == "ds://stable@2" and doc["derived_from"] == "ds://stable@1"
    assert doc["sha256"] == first.json()["sha256"]
    assert doc["splits"]["eval"]["rows"] > first.json()["splits"]["eval"]["rows"]
    more = api.upload(rows + chats(10, "extra"), "stable", derived_from="ds://stable@2")
    assert more.json()["derived_from"] == "ds://stable@2" and more.json()["version"] == 3
    listed = api.c.get("/v1/datasets", params={"name": "stable"}, headers=api.admin).json()["datasets"]
    assert [d["version"] for d in listed] == [3, 2, 1]
    assert api.c.get("/v1/datasets/stable", headers=api.admin).json()["version"] == 3


def test_another_tenants_dataset_is_404_and_lists_are_scoped(api: Api) -> None:
    assert api.upload(chats(20, "mine"), "private").status_code == 201
    r = api.c.get("/v1/datasets/private@1", headers=api.other)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_dataset"
    missing = api.c.get("/v1/datasets/never-uploaded@1", headers=api.other)
    assert (
        missing.status_code == 404
        and missing.json()["error"]["message"].replace("never-uploaded", "private")
        == r.json()["error"]["message"]
    )
    assert api.c.get("/v1/datasets/private@1/rows", headers=api.other).status_code == 404
    assert all(
        d["name"] != "private" for d in api.c.get("/v1/datasets", headers=api.other).json()["datasets"]
    )
    # the other tenant's own upload of the same name is its own version 1, in its own storage area
    assert api.upload(chats(20, "theirs"), "private", headers=api.other).json()["id"] == "ds://private@1"
    assert storage_files(api, "ds-other")


def test_rows_pagination(api: Api) -> None:
    api.upload([f"row {i}" for i in range(25)], "pages", eval_fraction=0.0)
    seen: list[Any] = []
    offset: int | None = 0
    while offset is not None:
        page = api.c.get(
            "/v1/datasets/pages@1/rows", params={"offset": offset, "limit": 10}, headers=api.admin
        ).json()
        seen.extend(page["rows"])
        offset = page["next_offset"]
    assert sorted(r["text"] for r in seen) == sorted(f"row {i}" for i in range(25))


def test_upload_over_the_limit_is_413(api: Api) -> None:
    r = api.upload(["x" * 1000] * 250, "huge")
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert api.c.get("/v1/datasets", params={"name": "huge"}, headers=api.admin).json() == {"datasets": []}


def test_submit_resolves_data_references_before_admission(api: Api) -> None:
    assert api.upload(chats(30, "sub"), "subdata").status_code == 201
    spec = tiny_spec("uses-ds", dataset="ds://subdata@1")
    ok = api.c.post("/v1/jobs", json={"spec": spec}, headers=api.admin)
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["workload"]["dataset"] == "ds://subdata@1"
    latest = api.c.post(
        "/v1/jobs", json={"spec": tiny_spec("latest", dataset="ds://subdata")}, headers=api.admin
    )
    assert latest.json()["spec"]["workload"]["dataset"] == "ds://subdata@1"  # pinned at submit
    epochs = tiny_spec("epochs", dataset="ds://subdata@1")
    del epochs["workload"]["steps"]
    epochs["workload"]["epochs"] = 2
    doc = api.c.post("/v1/jobs", json={"spec": epochs}, headers=api.admin).json()
    train_rows = api.c.get("/v1/datasets/subdata@1", headers=api.admin).json()["splits"]["train"]["rows"]
    assert doc["spec"]["workload"]["dataset_tokens"] == train_rows * 64

    for ref, headers in (
        ("ds://nope@1", api.admin),
        ("ds://subdata@9", api.admin),
        ("ds://subdata@1", api.other),  # another tenant's version: as unknown as a missing one
    ):
        r = api.c.post("/v1/jobs", json={"spec": tiny_spec("bad", dataset=ref)}, headers=headers)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_spec" and err["details"]["errors"][0]["field"] == "workload.dataset"
    encoder = tiny_spec("enc", dataset="ds://subdata@1")
    encoder["model"] = {**encoder["model"], "architecture": "encoder"}
    r = api.c.post("/v1/jobs", json={"spec": encoder}, headers=api.admin)
    assert r.status_code == 422 and "cannot learn" in r.json()["error"]["message"]


def test_base_model_tokenizer_counts_tokens_and_its_context_bounds_rows(
    api: Api, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`--base NAME@V`: tokens are counted with that version's own tokenizer (a BPE trained here), rows
    longer than its context (config max_position_embeddings: 128) are errors with their line, and
    another tenant's model is as unknown as a missing one."""
    from tokenizers import Tokenizer

    from hf_models import build_tiny_llama, completion_rows

    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tok") / "tiny", seed=0)
    admin = api.platform.tenants.authenticate(api.admin["Authorization"].split()[1])
    api.platform.registry.import_directory(admin, model_dir, "tokbase")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def n(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    rows = completion_rows(30, seed=5)
    r = api.upload(rows, "tok-counted", base="tokbase@1", eval_fraction=0)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["tokenizer"] == "tokbase@1"
    unique = {json.dumps(x, sort_keys=True): x for x in rows}.values()
    assert doc["splits"]["train"]["tokens"] == sum(n(x["prompt"]) + n(x["completion"]) + 1 for x in unique)
    by_bytes = api.upload(rows, "tok-counted", eval_fraction=0).json()
    assert by_bytes["tokenizer"] == "bytes" and by_bytes["version"] == doc["version"] + 1
    assert by_bytes["splits"]["train"]["tokens"] != doc["splits"]["train"]["tokens"]

    long_prompt = " ".join(["red blue green"] * 50)
    assert n(long_prompt) + n(" yes") + 1 > 128
    r = api.upload(
        [*rows[:3], {"prompt": long_prompt, "completion": " yes"}, rows[4]], "tok-long", base="tokbase@1"
    )
    assert r.status_code == 422, r.text
    errors = r.json()["error"]["details"]["errors"]
    assert [(e["line"], e["kind"]) for e in errors] == [(4, "too_long")]
    assert "context of 128" in errors[0]["message"]

    for who in (api.admin, api.other):
        base = "nosuch@1" if who is api.admin else "tokbase@1"
        r = api.upload(rows, "tok-unknown", headers=who, base=base)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["details"]["errors"] == [{"field": "base", "message": "unknown base model"}]


def test_cost_per_epoch_is_steps_times_step_time_times_price_on_the_cheapest_placement(
    api: Api, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """GET /v1/datasets/REF/cost quotes a one-epoch fine-tune of the upload's base model with the
    platform's quoter: the steps are the train split over seq_len × global_batch, the price is the
    cheapest feasible option's, and a byte-counted version needs a model; another tenant's is 404."""
    from hf_models import build_tiny_llama, completion_rows
    from trainyard.services.quoting import quote_pools
    from trainyard.spec.loader import spec_from_dict

    model_dir = build_tiny_llama(tmp_path_factory.mktemp("cost") / "tiny", seed=0)
    admin = api.platform.tenants.authenticate(api.admin["Authorization"].split()[1])
    api.platform.registry.import_directory(admin, model_dir, "costbase")
    up = api.upload(completion_rows(50, seed=8), "costed", base="costbase@1", eval_fraction=0.2).json()
    r = api.c.get(
        f"/v1/datasets/{up['name']}@{up['version']}/cost",
        params={"seq_len": 64, "global_batch": 4},
        headers=api.admin,
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    train_rows = up["splits"]["train"]["rows"]
    assert doc["model"] == "costbase@1" and doc["train_rows"] == train_rows
    assert doc["steps_per_epoch"] == -(-train_rows * 64 // (64 * 4))  # one padded sample per row
    # the same as quoting the one-epoch spec directly, and the cheapest of its feasible options
    spec_doc = api.platform.datasets.resolve_spec_document(
        admin,
        {"apiVersion": "trainyard/v1", "kind": "TrainingJob", "name": "x", "model": {"base": "costbase@1"},
         "workload": {"dataset": up["id"], "epochs": 1, "seq_len": 64, "global_batch": 4}},
    )  # fmt: skip
    spec = api.platform.registry.resolve_spec(admin.tenant_id, spec_from_dict(spec_doc))
    pools = quote_pools(api.platform.pools.pools(), with_catalog=api.platform.options.with_catalog)
    options = [o for o in api.platform.options.quoter(spec, pools) if o.feasible]
    best = min(options, key=lambda o: o.expected_cost_usd)
    assert doc["usd_per_epoch"] == pytest.approx(best.expected_cost_usd)
    assert doc["placement"]["accelerator"] == best.accelerator
    assert doc["step_time_s"] == pytest.approx(best.step_time_s) and doc["step_time_s"] > 0
    # steps × step time × price, up to the checkpoint and preemption overhead the quote adds
    base_cost = doc["steps_per_epoch"] * doc["step_time_s"] / 3600 * doc["usd_per_hour"]
    assert base_cost <= doc["usd_per_epoch"] * 1.000001

    plain = api.upload(completion_rows(20, seed=9), "costed-bytes").json()
    r = api.c.get(f"/v1/datasets/{plain['name']}@{plain['version']}/cost", headers=api.admin)
    assert r.status_code == 422 and r.json()["error"]["details"]["errors"][0]["field"] == "model"
    r = api.c.get(
        f"/v1/datasets/{plain['name']}@{plain['version']}/cost",
        params={"model": "costbase@1", "seq_len": 64},
        headers=api.admin,
    )
    assert r.status_code == 200 and r.json()["model"] == "costbase@1"
    r = api.c.get(f"/v1/datasets/{up['name']}@{up['version']}/cost", headers=api.other)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_dataset"
