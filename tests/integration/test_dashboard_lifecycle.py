"""The lifecycle pages and the dashboard's actions against a real SQLite store and the real services:
datasets uploaded through the API, model versions imported into the registry, deployments created
through the API; cancel, preempt, promote and traffic changes from the pages, with CSRF tokens, the
viewer role and other tenants' resources (404) checked the way the API checks them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import Env, chart, csrf, run_job

from controlplane_support import tiny_spec
from hf_models import build_tiny_llama, completion_rows
from trainyard.web import lifecycle


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    e.p.close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny", seed=0)


def import_versions(e: Env, src: Path, name: str, n: int) -> list[str]:
    admin = e.p.tenants.authenticate(e.key)
    ids = []
    for i in range(n):
        copy = e.p.settings.home / f"import-{name}-{i}"
        shutil.copytree(src, copy)
        ids.append(e.p.registry.import_directory(admin, copy, name).id)
        shutil.rmtree(copy, ignore_errors=True)
    return ids


def upload_dataset(e: Env, name: str, rows: list[dict[str, Any]], key: str | None = None) -> dict[str, Any]:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    h = {"Authorization": f"Bearer {key or e.key}", "Content-Type": "application/octet-stream"}
    r = e.client().post(f"/v1/datasets?name={name}&eval_fraction=0.2", content=body, headers=h)
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def viewer_key(e: Env) -> str:
    return e.p.tenants.create_key("default", role="viewer")


def test_cancel_needs_the_sessions_csrf_token_a_non_viewer_and_the_own_tenant(env: Env) -> None:
    jid = run_job(env, "to-cancel")
    _, other_key = env.p.tenants.create("other")
    other = env.browser(other_key)
    r = other.post(f"/jobs/{jid}/cancel", data={"csrf": csrf(other.get("/").text)}, follow_redirects=False)
    assert r.status_code == 404  # another tenant's job is not there
    viewer = env.browser(viewer_key(env))
    page = viewer.get(f"/jobs/{jid}").text
    assert "cancel-button" not in page  # no button for a viewer ...
    r = viewer.post(f"/jobs/{jid}/cancel", data={"csrf": csrf(page)}, follow_redirects=False)
    assert r.status_code == 403  # ... and no way around it
    me = env.browser()
    page = me.get(f"/jobs/{jid}").text
    assert "cancel-button" in page and "preempt-button" in page
    assert me.post(f"/jobs/{jid}/cancel", follow_redirects=False).status_code == 403  # no token
    assert me.post(f"/jobs/{jid}/cancel", data={"csrf": "forged"}, follow_redirects=False).status_code == 403
    assert other.post(f"/jobs/{jid}/cancel", data={"csrf": csrf(page)}).status_code == 403  # not its token
    assert env.client().get(f"/v1/jobs/{jid}", headers=env.h).json()["state"] == "running"
    r = me.post(f"/jobs/{jid}/cancel", data={"csrf": csrf(page)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{jid}?done=cancelled"
    assert env.client().get(f"/v1/jobs/{jid}", headers=env.h).json()["state"] == "cancelled"
    done = me.get(r.headers["location"]).text
    assert "The job was cancelled." in done and "cancel-button" not in done
    r = me.post(f"/jobs/{jid}/cancel", data={"csrf": csrf(page)}, follow_redirects=False)
    assert r.status_code == 409  # finished already: the API's conflict, as a page


def test_preempt_from_the_page_goes_through_the_supervisor(env: Env) -> None:
    jid = run_job(env, "drill")
    b = env.browser()
    r = b.post(
        f"/jobs/{jid}/preempt", data={"csrf": csrf(b.get(f"/jobs/{jid}").text)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    assert [j for j, _ in env.ex.preempted] == [jid]


def test_live_endpoint_sends_only_what_is_new(env: Env) -> None:
    jid = run_job(env, "live")
    b = env.browser()
    page = b.get(f"/jobs/{jid}").text
    live = json.loads(page.split('id="job-live">', 1)[1].split("</script>", 1)[0])
    assert live["url"] == f"/jobs/{jid}/live" and not live["terminal"]
    first = b.get(f"{live['url']}?after={live['after']}").json()
    assert first["events"] == [] and first["loss"] == {} and first["next_after"] == live["after"]
    env.clock.now += 10
    env.event(
        jid, "heartbeat", {"rank": 0, "step": 25, "loss": 1.875, "step_time_s": 0.12, "total_steps": 40}
    )
    env.p.tick()
    news = b.get(f"{live['url']}?after={live['after']}").json()
    assert news["loss"] == {"1": [[25.0, 1.875]]} and news["step_times"] == [[25.0, 0.12]]
    assert news["step"] == 25 and news["total_steps"] == 40 and news["state"] == "running"
    assert news["events"][0]["summary"] == "step 25 of 40, loss 1.875, 0.12 s/step"
    assert news["cost_text"].startswith("$") and "e-" not in news["cost_text"]
    assert [c["step"] for c in news["checkpoints"]] == [10]
    assert news["next_after"] > live["after"]
    assert b.get(f"{live['url']}?after={news['next_after']}").json()["events"] == []
    _, other_key = env.p.tenants.create("other")
    assert env.browser(other_key).get(live["url"]).status_code == 404
    r = env.client().get(live["url"])
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"


def test_dataset_pages_show_versions_validation_splits_and_rows(env: Env) -> None:
    rows = completion_rows(40, seed=3) + completion_rows(2, seed=3)  # two exact duplicates
    doc = upload_dataset(env, "support", rows)
    b = env.browser()
    listing = b.get("/datasets").text
    assert doc["id"] in listing and "/datasets/support@1" in listing
    page = b.get("/datasets/support@1")
    assert page.status_code == 200, page.text
    html = page.text
    assert "exact duplicates removed</th><td>2" in html and "lines read</th><td>42" in html
    split = {b_["label"]: b_["value"] for b_ in chart(html, "split-sizes")["bars"]}
    assert split == {"train": doc["splits"]["train"]["rows"], "eval": doc["splits"]["eval"]["rows"]}
    assert 'id="samples-train"' in html and 'id="samples-eval"' in html
    assert "<dt>prompt</dt>" in html and "<dt>completion</dt>" in html
    _, other_key = env.p.tenants.create("other")
    other = env.browser(other_key)
    assert other.get("/datasets/support@1").status_code == 404
    assert "support" not in other.get("/datasets").text.split("<main>")[1]


def test_models_are_paged_with_aliases_lineage_and_promotion(env: Env, tiny_model: Path) -> None:
    ids = import_versions(env, tiny_model, "tiny", 3)
    assert ids == ["tiny@1", "tiny@2", "tiny@3"]
    admin = env.p.tenants.authenticate(env.key)
    page = lifecycle.models_page(env.p, admin, name=None, offset=0, limit=2)
    assert [r["id"] for r in page["rows"]] == ["tiny@3", "tiny@2"] and page["total"] == 3
    assert page["next_offset"] == 2
    rest = lifecycle.models_page(env.p, admin, name=None, offset=2, limit=2)
    assert [r["id"] for r in rest["rows"]] == ["tiny@1"] and rest["next_offset"] is None
    b = env.browser()
    assert all(i in b.get("/models").text for i in ids)
    assert b.get("/models?offset=-1").status_code == 422
    html = b.get("/models/tiny@2").text
    assert 'id="promote-form"' in html and 'id="lineage"' in html
    r = b.post(
        "/models/tiny@2/promote", data={"alias": "staging", "csrf": csrf(html)}, follow_redirects=False
    )
    assert r.status_code == 303 and r.headers["location"] == "/models/tiny@2?done=promoted"
    html = b.get(r.headers["location"]).text
    assert "The alias was moved." in html and 'class="badge alias">staging' in html
    assert "alias-history" in html and "default (admin)" in html
    assert env.client().get("/v1/models/tiny@staging", headers=env.h).json()["id"] == "tiny@2"
    # production is gated on a passing evaluation, exactly as through the API
    r = b.post("/models/tiny@3/promote", data={"alias": "production", "csrf": csrf(html)})
    assert r.status_code == 409 and "tiny@3 has no production version" in r.text and "--force" in r.text
    viewer = env.browser(viewer_key(env))
    vpage = viewer.get("/models/tiny@2").text
    assert 'id="promote-form"' not in vpage
    r = viewer.post("/models/tiny@3/promote", data={"alias": "staging", "csrf": csrf(vpage)})
    assert r.status_code == 403
    assert env.client().get("/v1/models/tiny@staging", headers=env.h).json()["id"] == "tiny@2"
    _, other_key = env.p.tenants.create("other")
    other = env.browser(other_key)
    assert other.get("/models/tiny@2").status_code == 404
    r = other.post("/models/tiny@2/promote", data={"alias": "staging", "csrf": csrf(other.get("/").text)})
    assert r.status_code == 404


def test_deployment_page_changes_traffic_through_the_serving_service(env: Env, tiny_model: Path) -> None:
    import_versions(env, tiny_model, "tiny", 2)
    r = env.client().post(
        "/v1/deployments", json={"name": "chat", "model": "tiny@1", "min_replicas": 0}, headers=env.h
    )
    assert r.status_code == 201, r.text
    b = env.browser()
    assert "/deployments/chat" in b.get("/deployments").text
    html = b.get("/deployments/chat").text
    assert chart(html, "route-weights")["bars"] == [{"label": "tiny@1", "value": 100.0, "color": "#2563eb"}]
    token = csrf(html)
    form = {"csrf": token, "model": ["tiny@1", "tiny@2"], "weight": ["90", "10"]}
    r = b.post("/deployments/chat/traffic", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    doc = env.client().get("/v1/deployments/chat", headers=env.h).json()
    assert [(x["model"], x["weight"]) for x in doc["routes"]] == [("tiny@1", 90.0), ("tiny@2", 10.0)]
    html = b.get(r.headers["location"]).text
    assert "The traffic routes were changed." in html and "traffic set to tiny@1 90, tiny@2 10" in html
    bad = {"csrf": token, "model": ["tiny@1", "tiny@2"], "weight": ["ninety", "-1"]}
    r = b.post("/deployments/chat/traffic", data=bad)
    assert r.status_code == 422 and "routes[0].weight" in r.text and "routes[1].weight" in r.text
    r = b.post("/deployments/chat/traffic", data={"csrf": token, "model": ["tiny@1"], "weight": ["0"]})
    assert r.status_code == 422 and "weight &gt; 0" in r.text  # the service's own rule
    assert b.post("/deployments/chat/traffic", data={"model": ["tiny@2"], "weight": ["1"]}).status_code == 403
    viewer = env.browser(viewer_key(env))
    assert 'id="traffic-form"' not in viewer.get("/deployments/chat").text
    vr = viewer.post("/deployments/chat/traffic", data={**form, "csrf": csrf(viewer.get("/").text)})
    assert vr.status_code == 403
    _, other_key = env.p.tenants.create("other")
    other = env.browser(other_key)
    assert other.get("/deployments/chat").status_code == 404
    assert (
        other.post("/deployments/chat/traffic", data={**form, "csrf": csrf(other.get("/").text)}).status_code
        == 404
    )
    doc = env.client().get("/v1/deployments/chat", headers=env.h).json()
    assert [(x["model"], x["weight"]) for x in doc["routes"]] == [("tiny@1", 90.0), ("tiny@2", 10.0)]


def test_evaluation_and_usage_pages(env: Env, tiny_model: Path) -> None:
    import_versions(env, tiny_model, "tiny", 2)
    area = Path(env.p.storage_policy.area("default", "datasets").removeprefix("file://"))
    area.mkdir(parents=True, exist_ok=True)
    split = area / "eval.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in completion_rows(30, seed=5)))
    r = env.client().post(
        "/v1/evaluations",
        json={"model": "tiny@2", "baseline": "tiny@1", "dataset": f"file://{split}"},
        headers=env.h,
    )
    assert r.status_code == 201, r.text
    eid = r.json()["id"]
    b = env.browser()
    assert eid in b.get("/evaluations").text
    page = b.get(f"/evaluations/{eid}")
    assert page.status_code == 200 and "tiny@2 vs tiny@1" in page.text
    _, other_key = env.p.tenants.create("other")
    assert env.browser(other_key).get(f"/evaluations/{eid}").status_code == 404
    spec = tiny_spec("tagged")
    spec["tags"] = {"team": "search"}
    env.submit(spec)
    r = env.client().put("/v1/budgets/default", json={"usd": 50}, headers=env.h)
    assert r.status_code == 200, r.text
    usage = b.get("/usage")
    assert usage.status_code == 200 and 'id="budgets"' in usage.text and "$50.00" in usage.text


def test_job_page_curves_come_from_step_metrics_when_the_workers_send_them(env: Env) -> None:
    jid = run_job(env, "per-step")
    steps = list(range(1, 301))
    env.event(
        jid,
        "metrics",
        {
            "rank": 0,
            "steps": steps,
            "time_s": [env.clock.now + 0.1 * s for s in steps],
            "values": {
                "loss": [4.0 / s for s in steps],
                "step_time_s": [0.25 for _ in steps],
                "eval_loss": [4.5 / s if s % 100 == 0 else None for s in steps],
            },
        },
    )
    env.p.tick()
    b = env.browser()
    html = b.get(f"/jobs/{jid}").text
    loss = chart(html, "loss-chart")
    assert len(loss["series"][0]["points"]) == 300  # every logged step, not one per heartbeat
    assert loss["series"][0]["points"][-1] == [300.0, 4.0 / 300]
    assert [s["label"] for s in loss["series"]] == ["attempt 1", "eval loss"]
    assert loss["series"][1]["points"] == [[100.0, 0.045], [200.0, 0.0225], [300.0, 0.015]]
    assert "step metrics" in html
    live = json.loads(html.split('id="job-live">', 1)[1].split("</script>", 1)[0])
    assert live["since_step"] == 300
    env.event(
        jid, "metrics", {"rank": 0, "steps": [301], "time_s": [env.clock.now], "values": {"loss": [0.01]}}
    )
    env.p.tick()
    news = b.get(f"{live['url']}?after={live['after']}&since_step={live['since_step']}").json()
    assert news["loss"] == {"1": [[301.0, 0.01]]} and news["next_since_step"] == 301


def test_the_gate_with_non_inferiority_guardrails_through_api_and_page(env: Env, tiny_model: Path) -> None:
    """An A/A comparison (two imports of the same weights) with a margin on exact match: the guardrail
    holds, the primary metric (loss) is not better, so the gate stays shut and says why — in the API
    document, on the evaluation page and in the promotion refusal. The scores come from the real
    evaluator run on the evaluation's own request; only the worker process is scripted."""
    from trainyard.evaluation.evaluator import evaluate_pair, read_rows

    import_versions(env, tiny_model, "tiny", 2)
    area = Path(env.p.storage_policy.area("default", "datasets").removeprefix("file://"))
    area.mkdir(parents=True, exist_ok=True)
    split = area / "eval.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in completion_rows(40, seed=5)))
    body = {"model": "tiny@2", "baseline": "tiny@1", "dataset": f"file://{split}"}
    bad = env.client().post(
        "/v1/evaluations",
        json={**body, "primary_metric": "bleu", "non_inferiority": {"exact_match": -0.1, "loss": 0.1}},
        headers=env.h,
    )
    assert bad.status_code == 422, bad.text
    fields = {e["field"] for e in bad.json()["error"]["details"]["errors"]}
    assert fields == {"primary_metric", "non_inferiority.exact_match"}
    r = env.client().post(
        "/v1/evaluations", json={**body, "non_inferiority": {"exact_match": 0.2}}, headers=env.h
    )
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["gate"] == {
        "primary_metric": "loss",
        "non_inferiority": {"exact_match": 0.2},
        "alpha": 0.05,
        "correction": "holm",
    }
    env.p.tick()  # place and launch the evaluation job
    out_dir = Path(env.p.storage_policy.area("default", "evaluations").removeprefix("file://")) / doc["id"]
    req = json.loads((out_dir / "request.json").read_text())
    rows = read_rows(req["split_path"])
    res = evaluate_pair(req["model_dir"], req["baseline_dir"], rows, fmt=req["format"], max_new_tokens=4)
    (out_dir / "results.json").write_text(json.dumps(res))
    env.event(doc["job_id"], "started", {"rank": 0, "pid": 4242, "host": "fakehost", "resumed_from_step": 0})
    env.clock.now += 5
    env.event(doc["job_id"], "succeeded", {"final_step": 2 * len(rows)})
    env.p.tick()
    doc = env.client().get(f"/v1/evaluations/{doc['id']}", headers=env.h).json()
    assert doc["state"] == "succeeded", doc
    assert doc["n"] == 40 and doc["metrics"]["loss"]["delta"] == 0.0
    (ni,) = [g for g in doc["guardrails"] if g["kind"] == "non_inferiority"]
    assert ni["name"] == "exact_match" and ni["test"] == "tango_score" and ni["passed"] is True
    assert ni["threshold"] == -0.2 and ni["value"] > -0.2 and ni["p_adjusted"] < 0.05
    assert {g["kind"] for g in doc["guardrails"]} == {"threshold", "non_inferiority"}
    assert doc["verdict"] == "no_difference" and doc["passed"] is False
    assert doc["reasons"][0].startswith("primary metric loss: no_difference")
    assert any(x.startswith("exact_match: non-inferior within margin 0.2") for x in doc["reasons"])
    page = env.browser().get(f"/evaluations/{doc['id']}")
    assert page.status_code == 200 and 'id="reasons"' in page.text
    assert "non-inferiority, margin 0.2" in page.text and "primary metric loss: no_difference" in page.text
    first = {"alias": "production", "force": True, "reason": "the first production version"}
    r = env.client().post("/v1/models/tiny@1/promote", json=first, headers=env.h)
    assert r.status_code == 200, r.text
    blocked = env.client().post("/v1/models/tiny@2/promote", json={"alias": "production"}, headers=env.h)
    assert blocked.status_code == 409, blocked.text
    err = blocked.json()["error"]
    assert err["code"] == "promotion_blocked" and "primary metric loss: no_difference" in err["message"]
    assert err["details"]["reasons"] == doc["reasons"]


def test_an_evaluation_is_launched_once_when_two_threads_launch_it(env: Env, tiny_model: Path) -> None:
    """The control loop and an API request may both launch the pending evaluations: each is claimed
    (pending -> launching) by exactly one of them, so one job is submitted."""
    import threading

    from sqlalchemy import select

    from trainyard.store.registry_models import EvaluationRow

    import_versions(env, tiny_model, "tiny", 2)
    area = Path(env.p.storage_policy.area("default", "datasets").removeprefix("file://"))
    area.mkdir(parents=True, exist_ok=True)
    split = area / "eval.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in completion_rows(30, seed=5)))
    with env.p.db.session() as s:
        tenant_id = env.p.tenants.authenticate(env.key).tenant_id
        row = env.p.evaluations.create_in(
            s,
            tenant_id,
            "default",
            model="tiny@2",
            baseline="tiny@1",
            dataset=f"file://{split}",
            split="eval",
        )
        eval_id = row.id
    start = threading.Barrier(4)

    def launch() -> None:
        start.wait()
        env.p.evaluations.launch_pending()

    threads = [threading.Thread(target=launch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    jobs = env.client().get("/v1/jobs", headers=env.h).json()["jobs"]
    tagged = [j for j in jobs if j["name"] == eval_id]  # an evaluation's job is named after it
    assert len(tagged) == 1
    with env.p.db.session() as s:
        stored = s.scalars(select(EvaluationRow).where(EvaluationRow.id == eval_id)).one()
        assert stored.state == "running" and stored.job_id == tagged[0]["id"]
