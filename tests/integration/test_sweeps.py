"""Sweeps end to end on this machine: trials are real jobs on the local executor, scheduled by the
optimiser as their sweep's group, successive halving reads their live step metrics and cancels the
losers, one budget holds across all trials, the group quote's simulation of the policy predicts what the
run spent, and the best trial's model is registered with lineage to the sweep. Another tenant's sweep is
404."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane_support import in_process_platform, tiny_spec
from trainyard.cost.sweep import SimTrial, estimate_search, promotes, rank_orders, simulate_asha
from trainyard.services.platform import Platform
from trainyard.services.scheduler_adapter import OptimizerRound
from trainyard.settings import Settings

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

PRICE_USD_PER_DEVICE_HOUR = 36.0  # 1 cent a second per CPU device: a trial costs cents, visibly
STEPS = 400
LEARNING_RATES = [3e-3, 1e-6, 1e-2, 3e-6, 1e-3, 1e-5]  # six trials; the tiny ones barely move the loss


def sweep_doc(name: str, *, budget_usd: float, rates: list[float], halving: bool = True) -> dict[str, Any]:
    template = tiny_spec(name, steps=STEPS, seed=7)
    template["checkpoint"] = {"interval": "1s"}  # stopped trials keep a checkpoint of where they were
    doc: dict[str, Any] = {
        "apiVersion": "trainyard/v1",
        "kind": "Sweep",
        "name": name,
        "method": "grid",
        "parameters": {"workload.learning_rate": {"values": rates}},
        "max_parallel": 2,
        "budget_usd": budget_usd,
        "metric": {"name": "loss", "goal": "minimize"},
        "template": template,
    }
    if halving:
        doc["early_stopping"] = {"method": "successive_halving", "reduction_factor": 2, "min_fraction": 0.25}
    return doc


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    settings = Settings(home=tmp_path_factory.mktemp("sweeps"), metrics_max_rows_per_s=0)
    with in_process_platform(
        settings, price_usd_per_device_hour=PRICE_USD_PER_DEVICE_HOUR, schedule_round=OptimizerRound()
    ) as live:
        yield live


def wait_sweep(c: TestClient, h: dict[str, str], sweep_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        doc = c.get(f"/v1/sweeps/{sweep_id}", headers=h).json()
        if doc["state"] in ("succeeded", "failed", "cancelled"):
            return doc
        time.sleep(0.5)
    raise AssertionError(
        f"{sweep_id} not done in {timeout_s} s: {doc.get('state')} {doc.get('trial_counts')}"
    )


def test_six_trial_sweep_is_quoted_run_halved_and_its_best_registered(live: Any) -> None:
    _platform, c, h = live
    budget = 5.0
    r = c.post("/v1/sweeps", json=sweep_doc("lr-halving", budget_usd=budget, rates=LEARNING_RATES), headers=h)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["state"] == "running"
    assert len(created["trials"]) == 6
    q = created["quote"]  # the group quote, before anything ran
    assert q["expected_cost_usd"] > 0 and q["max_cost_usd"] >= q["expected_cost_usd"] * (1 - 1e-9)
    assert [rung["steps"] for rung in q["rungs"]] == [100, 200, 400]

    doc = wait_sweep(c, h, created["id"])
    assert doc["state"] == "succeeded", doc
    trials = doc["trials"]
    stopped = [t for t in trials if t["state"] == "stopped"]
    completed = [t for t in trials if t["state"] == "completed"]
    assert stopped, [(t["name"], t["state"], t["rungs"], t["decisions"]) for t in trials]
    assert completed
    for t in stopped:  # stopped for real: the job was cancelled, its checkpoints are kept
        job = c.get(f"/v1/jobs/{t['job_id']}", headers=h).json()
        assert job["state"] == "cancelled"
        # a trial that reaches its first rung within the 1 s checkpoint interval (a warm worker runs
        # 100 steps in about 1.2 s) is stopped before it has written one; any it wrote is kept
        if job["checkpoints"]:
            assert t["checkpoint"]["step"] == job["checkpoints"][-1]["step"] < STEPS
        else:
            assert "checkpoint" not in t, t
        assert "successive halving" in t["reason"]
        decided = [d for d in t["decisions"].values() if not d["continue"]]
        assert len(decided) == 1 and decided[0]["rank"] > 1
        # the metric the decision used is the one the platform serves for the job
        curve = c.get(f"/v1/jobs/{t['job_id']}/metrics", headers=h).json()
        assert curve["points"] and curve["last_step"] < STEPS

    # the budget across every trial: what the jobs were charged, and never more than the budget
    costs = [c.get(f"/v1/jobs/{t['job_id']}", headers=h).json()["cost_usd"] for t in trials if t["job_id"]]
    assert doc["spent_usd"] == pytest.approx(sum(costs), abs=1e-4)
    assert 0 < doc["spent_usd"] <= budget

    best = doc["best_trial"]
    values = {t["index"]: t["final_value"] for t in completed}
    assert best["index"] == min(values, key=lambda i: values[i])
    version = c.get(f"/v1/models/{doc['model_version']}", headers=h).json()
    assert version["name"] == "lr-halving"
    assert version["source_job"] == best["job_id"]
    assert version["sweep"]["id"] == doc["id"]
    assert version["sweep"]["parameters"] == best["parameters"]
    assert version["sweep"]["trial"] == best["index"]

    listed = c.get("/v1/sweeps", headers=h).json()["sweeps"]
    assert doc["id"] in [s["id"] for s in listed]

    # scheduled as a group: every trial on the sweep's one pool, the optimiser saying so
    jobs = {t["index"]: c.get(f"/v1/jobs/{t['job_id']}", headers=h).json() for t in trials if t["job_id"]}
    assert {j["placement"]["pool"] for j in jobs.values()} == {q["pool"]} == {"local-cpu"}
    assert all(f"shares {q['pool']}" in j["placement"]["reason"] for j in jobs.values()), jobs
    check_quote_against_the_run(doc, jobs, budget)


def check_quote_against_the_run(doc: dict[str, Any], jobs: dict[int, dict[str, Any]], budget: float) -> None:
    """The group quote's simulation of the policy against what the run spent. The simulation runs on what
    the trials really cost a step and to start (fitted to their attempts: seconds billed = start-up +
    steps x step time) and on the costs admission predicted for them (which decide what waits and what is
    skipped): the spend lies between the cheapest and the dearest order of the trials' ranks (within 15 %
    for the fit). The run is one order of the ranks and one order of arrivals at the rungs: its spend is
    one draw of the distribution whose mean the quote states, so the mean is not compared with it, and
    which trials halving stops depends on which reached a rung first, so every decision is checked
    against the rule on the values recorded at that rung by then. The pre-run quote itself is priced on
    the predictor's step time and the cost model's 60 s CPU start-up, which this machine's tiny trials do
    not take; those errors are the predictor's."""
    trials = doc["trials"]
    rate = PRICE_USD_PER_DEVICE_HOUR / 3600.0
    billed = [
        (float(t["last_step"] or 0), jobs[t["index"]]["cost_usd"] / rate) for t in trials if t["job_id"]
    ]
    n = len(billed)
    mx, my = sum(x for x, _ in billed) / n, sum(y for _, y in billed) / n
    sxx = sum((x - mx) ** 2 for x, _ in billed)
    assert sxx > 0, billed  # trials stopped at different steps: start-up and step time are told apart
    step_s = max(1e-6, sum((x - mx) * (y - my) for x, y in billed) / sxx)
    startup_s = max(0.0, my - step_s * mx)
    decisions = tuple(r["steps"] for r in doc["quote"]["rungs"][:-1])
    sims = [SimTrial(rate, startup_s, step_s, STEPS, decisions, t["predicted_cost_usd"]) for t in trials]
    run = {"reduction_factor": 2, "max_parallel": 2, "budget_usd": budget}
    expected = estimate_search(sims, **run)
    assert expected.outcomes == 720
    orders = rank_orders(len(sims), seed=0)
    costs = [
        simulate_asha(sims, [[float(o[i])] * len(decisions) for i in range(len(sims))], **run).cost_usd
        for o in orders
    ]
    assert max(costs) == pytest.approx(expected.max_cost_usd)
    spent = doc["spent_usd"]
    facts = (spent, min(costs), expected, step_s, startup_s, billed, [t["state"] for t in trials])
    quoted = doc["quote"]["expected_cost_usd"]
    print(
        f"spent ${spent:.4f}; simulated mean ${expected.expected_cost_usd:.4f} "
        f"(min ${min(costs):.4f}, max ${expected.max_cost_usd:.4f}); pre-run quote ${quoted:.4f}; "
        f"fitted step {step_s:.4f} s, start-up {startup_s:.2f} s; states {facts[-1]}"
    )
    assert 0.85 * min(costs) <= spent <= 1.15 * expected.max_cost_usd, facts
    check_decisions_follow_the_rule(trials, reduction_factor=2)


def check_decisions_follow_the_rule(trials: list[dict[str, Any]], *, reduction_factor: int) -> None:
    """Every halving decision is ASHA's rule applied to the values recorded at its rung when it was made:
    those of the trials whose value there was recorded at or before it (one poll records and decides
    together; a trial that records the rung later, or ends before a decision there, is not among them)."""
    made = 0
    for t in trials:
        for key, d in t["decisions"].items():
            decided = datetime.fromisoformat(d["time"])
            assert datetime.fromisoformat(t["rung_times"][key]) <= decided, (t["name"], key, d)
            known = [
                float(o["rungs"][key])
                for o in trials
                if o["rungs"].get(key) is not None and datetime.fromisoformat(o["rung_times"][key]) <= decided
            ]
            facts = (t["name"], key, d, known)
            assert d["value"] == pytest.approx(float(t["rungs"][key])), facts
            assert d["of"] == len(known), facts
            assert d["continue"] == promotes(d["value"], known, reduction_factor, "minimize"), facts
            assert d["rank"] == 1 + sum(1 for v in known if v < d["value"]), facts
            made += 1
    assert made >= len(trials), trials  # every trial was decided at its first rung at least


@pytest.fixture(scope="module")
def pricey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Platform, TestClient, dict[str, str]]]:
    """A platform of its own where a CPU device costs 10 cents a second."""
    settings = Settings(home=tmp_path_factory.mktemp("sweeps-budget"), metrics_max_rows_per_s=0)
    with in_process_platform(settings, price_usd_per_device_hour=360.0) as live:
        yield live


def test_the_budget_stops_trials_that_cost_more_than_predicted(pricey: Any) -> None:
    """The template claims a step time far below the real one, so a trial is predicted to fit the budget
    and costs much more. Only one trial is started (two would not fit the prediction); when what it
    really costs comes within 5 s of spend of the budget it is cancelled, the rest never start, and the
    sweep has spent no more than its budget — the jobs' costs and the usage ledger agree."""
    _platform, c, h = pricey
    doc = sweep_doc("lr-budget", budget_usd=1.0, rates=[1e-3, 2e-3, 3e-3, 4e-3], halving=False)
    doc["template"]["workload"]["steps"] = 50_000
    doc["template"]["measured"] = {"step_time_s": {"cpu": 1e-4}}  # optimistic: the real one is ~100x
    trial = {**doc["template"], "workload": {**doc["template"]["workload"], "learning_rate": 1e-3}}
    quoted = c.post("/v1/quotes", json={"spec": trial, "include_catalog": False}, headers=h)
    assert quoted.status_code == 200, quoted.text
    predicted = next(o for o in quoted.json()["options"] if o["feasible"])["expected_cost_usd"]
    budget = doc["budget_usd"] = round(1.2 * predicted, 4)  # one trial fits, two do not
    r = c.post("/v1/sweeps", json=doc, headers=h)
    assert r.status_code == 201, r.text
    done = wait_sweep(c, h, r.json()["id"], timeout_s=400)
    assert done["state"] == "cancelled" and done["budget_stopped"], done
    assert "budget" in done["reason"]
    states = [t["state"] for t in done["trials"]]
    assert states == ["cancelled", "skipped", "skipped", "skipped"], states
    job = c.get(f"/v1/jobs/{done['trials'][0]['job_id']}", headers=h).json()
    assert job["state"] == "cancelled"
    assert job["cost_usd"] == pytest.approx(done["spent_usd"], abs=1e-4)
    assert budget - 0.5 <= done["spent_usd"] <= budget  # stopped 5 s ($0.50) of spend early, not later
    usage = c.get("/v1/usage", params={"by": "tag:sweep"}, headers=h)
    assert usage.status_code == 200, usage.text
    rows = {row["group"]: row["usd"] for row in usage.json()["rows"]}
    assert rows.get("lr-budget") == pytest.approx(done["spent_usd"], abs=1e-3)


def test_another_tenants_sweep_is_404_and_cancel_stops_trials(live: Any) -> None:
    _platform, c, h = live
    r = c.post("/v1/tenants", json={"name": "other-team"}, headers=h)
    assert r.status_code == 201, r.text
    other = {"Authorization": f"Bearer {r.json()['api_key']}"}
    mine = c.post("/v1/sweeps", json=sweep_doc("lr-mine", budget_usd=5.0, rates=[1e-3, 2e-3]), headers=h)
    assert mine.status_code == 201, mine.text
    sweep_id = mine.json()["id"]
    for method, path in (("get", f"/v1/sweeps/{sweep_id}"), ("post", f"/v1/sweeps/{sweep_id}/cancel")):
        resp = getattr(c, method)(path, headers=other)
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "not_found"
    assert c.get("/v1/sweeps", headers=other).json()["sweeps"] == []
    assert c.post(f"/v1/sweeps/{sweep_id}/cancel", headers=h).json()["state"] in ("cancelling", "cancelled")
    done = wait_sweep(c, h, sweep_id, timeout_s=120)
    assert done["state"] == "cancelled"
    for t in done["trials"]:
        assert t["state"] in ("cancelled", "skipped"), t
        if t["job_id"]:
            assert c.get(f"/v1/jobs/{t['job_id']}", headers=h).json()["state"] in ("cancelled", "succeeded")


def test_invalid_and_infeasible_sweeps_are_refused(live: Any) -> None:
    _, c, h = live
    bad = sweep_doc("lr-bad", budget_usd=1.0, rates=[1e-3])
    bad["parameters"] = {"workload.nope.x": {"values": [1]}}
    r = c.post("/v1/sweeps", json=bad, headers=h)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_spec", r.text
    gpu = sweep_doc("lr-gpu", budget_usd=1.0, rates=[1e-3])
    gpu["template"]["requirements"] = {"allow": ["h100"]}
    r = c.post("/v1/sweeps", json=gpu, headers=h)
    assert r.status_code == 422 and r.json()["error"]["code"] == "infeasible", r.text


def test_a_sweep_carries_on_after_a_control_plane_restart(tmp_path: Any) -> None:
    """The sweep lives in the database: after the control plane stops (its workers killed) and starts
    again, the trials resume from their checkpoints, none is submitted twice, and the sweep finishes."""
    settings = Settings(home=tmp_path / "home", metrics_max_rows_per_s=0)
    doc = sweep_doc("lr-restart", budget_usd=5.0, rates=[1e-3, 1e-5], halving=False)
    with in_process_platform(settings, price_usd_per_device_hour=PRICE_USD_PER_DEVICE_HOUR) as (_, c, h):
        sweep_id = c.post("/v1/sweeps", json=doc, headers=h).json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            trials = c.get(f"/v1/sweeps/{sweep_id}", headers=h).json()["trials"]
            if all((t["last_step"] or 0) > 20 for t in trials):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"the trials did not start: {trials}")
        before = {t["index"]: t["job_id"] for t in trials}
    with in_process_platform(settings, price_usd_per_device_hour=PRICE_USD_PER_DEVICE_HOUR) as (_, c, h):
        done = wait_sweep(c, h, sweep_id, timeout_s=300)
        assert done["state"] == "succeeded", done
        assert {t["index"]: t["job_id"] for t in done["trials"]} == before
        jobs = c.get("/v1/jobs", params={"limit": 50}, headers=h).json()["jobs"]
        assert len([j for j in jobs if j["name"].startswith("lr-restart-")]) == 2
        for t in done["trials"]:
            job = c.get(f"/v1/jobs/{t['job_id']}", headers=h).json()
            assert job["state"] == "succeeded" and job["attempt"] >= 2, (job["state"], job["attempt"])
        assert done["model_version"] == "lr-restart@1"
        assert done["spent_usd"] <= 5.0
