"""The dashboard in a real browser: headless Chromium (Debian's, at /usr/bin/chromium, driven by
Playwright) against a real server on 127.0.0.1 (uvicorn serving the app of a platform with the local
executor: real worker processes train and evaluate). Logs in, follows a running job
whose curve grows without a reload, opens a dataset, compares an evaluation, changes a deployment's
traffic and cancels the job from its page. Every page is checked for console errors and for content
wider than a 1,100 px window; screenshots are kept in $TRAINYARD_TEST_ARTIFACTS (default: the test's
tmp_path)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from controlplane_support import free_port, tiny_spec
from hf_models import build_tiny_llama, completion_rows
from trainyard.api.app import create_app
from trainyard.client.client import TrainyardClient
from trainyard.executors.local import LocalExecutor
from trainyard.services.platform import Platform, PlatformOptions
from trainyard.services.scheduling import GreedyCheapestRound
from trainyard.settings import Settings

CHROMIUM = "/usr/bin/chromium"
WIDTH_PX = 1100

pytestmark = pytest.mark.slow


class Server:
    """The platform with the local executor and its scheduling loop, served by uvicorn."""

    def __init__(self, home: Path) -> None:
        self.executor = LocalExecutor(heartbeat_timeout_s=120.0)
        self.platform = Platform.open(
            # webhooks to 127.0.0.1 (nothing listens there: a delivery waits for its retry)
            Settings(home=home, webhook_allowed_networks="127.0.0.1/32", webhook_backoff_initial_s=600.0),
            PlatformOptions(
                executor=self.executor,
                schedule_round=GreedyCheapestRound(),
                cpu_count=2,
                with_catalog=False,
                loop_interval_s=0.2,
            ),
        )
        self.platform.pools.update("local-cpu", {"price_usd_per_device_hour": 3.6})
        self.platform.start_loop()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.api_key = self.platform.settings.api_key_path.read_text().strip()
        self.uvicorn = uvicorn.Server(
            uvicorn.Config(
                create_app(self.platform, access_log=False), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        self.thread = threading.Thread(target=self.uvicorn.run, name="api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.uvicorn.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.uvicorn.started, "the API server did not start"

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(10)
        self.platform.stop_loop()
        self.executor.shutdown(kill_workers=True)
        self.platform.close()


class World:
    def __init__(self, server: Server, client: TrainyardClient, **ids: Any) -> None:
        self.server = server
        self.c = client
        self.ids = ids


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("browser-home")
    server = Server(home)
    c = TrainyardClient(server.url, server.api_key, retries=0, timeout_s=120.0)
    try:
        models = tmp_path_factory.mktemp("browser-models")
        c.import_model(build_tiny_llama(models / "a", seed=0), "tiny")
        c.import_model(build_tiny_llama(models / "b", seed=1), "tiny")
        rows = completion_rows(60, seed=2)
        data = models / "support.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        ds = c.upload_dataset(data, name="support", eval_fraction=0.25)
        # an evaluation split in the tenant's own storage (DESIGN §3.6)
        area = home / "storage" / "tenants" / "default" / "datasets"
        area.mkdir(parents=True, exist_ok=True)
        split = area / "eval-split.jsonl"
        split.write_text("".join(json.dumps(r) + "\n" for r in completion_rows(24, seed=7)))
        ev = c.run_evaluation(model="tiny@2", baseline="tiny@1", dataset=f"file://{split}")
        c.create_deployment("chat", "tiny@1", min_replicas=0)
        evaluation = c.wait_evaluation(ev["id"], timeout_s=300)
        assert evaluation["state"] == "succeeded", evaluation
        job = c.submit(tiny_spec("follow-me", steps=100_000))  # runs until the test cancels it
        yield World(server, c, dataset=ds["id"], evaluation=ev["id"], job=job["id"])
    finally:
        c.close()
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: `make browser` installs Debian's chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    root = os.environ.get("TRAINYARD_TEST_ARTIFACTS")
    out = Path(root) / "dashboard" if root else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


class Page:
    """One logged-in browser tab that records console errors and failed requests."""

    def __init__(self, browser: Any, world: World, shots: Path) -> None:
        self.ctx = browser.new_context(viewport={"width": WIDTH_PX, "height": 900})
        self.page = self.ctx.new_page()
        self.world = world
        self.shots = shots
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )

    def url(self, path: str) -> str:
        return self.world.server.url + path

    def login(self) -> None:
        self.page.goto(self.url("/"))
        assert "/login" in self.page.url
        self.page.fill("#api_key", self.world.server.api_key)
        self.page.click("form[action='/login'] button[type=submit]")
        self.page.wait_for_url(self.url("/"))

    def check(self, name: str) -> None:
        """No console errors, nothing wider than the window; a screenshot as an artefact."""
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)
        assert self.errors == [], self.errors
        overflow = self.page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= WIDTH_PX, f"{name}: content is {overflow} px wide in a {WIDTH_PX} px window"

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def tab(browser: Any, world: World, artefacts: Path) -> Iterator[Page]:
    t = Page(browser, world, artefacts)
    t.login()
    yield t
    t.close()


def wait_running(c: TrainyardClient, job_id: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = c.get_job(job_id)
        assert doc["state"] not in ("failed", "cancelled", "succeeded"), doc
        if doc["state"] == "running" and c.job_metrics(job_id)["points"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{job_id} did not start reporting in {timeout_s} s")


def test_follow_a_running_job_without_reloading_and_cancel_it(tab: Page, world: World) -> None:
    jid = world.ids["job"]
    wait_running(world.c, jid)
    p = tab.page
    p.goto(tab.url(f"/jobs/{jid}"))
    p.wait_for_selector("#loss-chart canvas")
    first = int(p.get_attribute("#loss-chart", "data-points") or 0)
    p.evaluate("window.__samePage = true")
    # the page asks for news every 2 s and redraws the curve in place (polled from here: the page's
    # CSP allows no string evaluation, which wait_for_function would need)
    deadline = time.monotonic() + 90
    while int(p.get_attribute("#loss-chart", "data-points") or 0) <= first:
        assert time.monotonic() < deadline, "the loss curve did not grow"
        p.wait_for_timeout(500)
    assert p.evaluate("window.__samePage") is True  # no reload happened
    assert p.locator("#live-status").inner_text().startswith("Updated")
    assert p.locator("#step-time-chart canvas").count() == 1
    assert "e-0" not in p.locator("#job-cost").inner_text()
    tab.check("job-live")
    p.once("dialog", lambda d: d.accept())
    p.click("#cancel-button")
    p.wait_for_url(f"**/jobs/{jid}?done=cancelled")
    assert "The job was cancelled." in p.content()
    assert world.c.get_job(jid)["state"] == "cancelled"
    tab.check("job-cancelled")


def test_open_a_dataset(tab: Page, world: World) -> None:
    p = tab.page
    p.click("nav >> text=Datasets")
    p.click(f"a:has-text('{world.ids['dataset']}')")
    p.wait_for_selector("#validation")
    assert "rows kept" in p.locator("#validation").inner_text()
    assert p.locator("#samples-train li").count() > 0 and p.locator("#samples-eval li").count() > 0
    p.wait_for_selector("#split-sizes canvas")
    tab.check("dataset")


def test_compare_an_evaluation(tab: Page, world: World) -> None:
    p = tab.page
    p.click("nav >> text=Evaluations")
    p.click(f"a:has-text('{world.ids['evaluation']}')")
    p.wait_for_selector("#metric-deltas canvas")
    table = p.locator("#metrics").inner_text().lower()
    assert "loss" in table and "tiny@2" in table and "tiny@1" in table
    assert int(p.get_attribute("#metric-deltas", "data-points") or 0) >= 1
    assert p.locator("#wins, #losses").count() >= 1
    tab.check("evaluation")


def test_change_deployment_traffic(tab: Page, world: World) -> None:
    p = tab.page
    p.click("nav >> text=Deployments")
    p.click("a:has-text('chat')")
    p.wait_for_selector("#traffic-form")
    p.fill("#routes input[aria-label='weight of tiny@1']", "90")
    p.fill("#routes input[aria-label='new route model']", "tiny@2")
    p.fill("#routes input[aria-label='weight of the new route']", "10")
    p.click("#traffic-form button[type=submit]")
    p.wait_for_url("**/deployments/chat?done=traffic")
    assert "The traffic routes were changed." in p.content()
    routes = world.c.get_deployment("chat")["routes"]
    assert [(r["model"], r["weight"]) for r in routes] == [("tiny@1", 90.0), ("tiny@2", 10.0)]
    p.wait_for_selector("#route-weights canvas")
    tab.check("deployment-traffic")
    for path in ("/", "/models", "/models/tiny@2", "/usage", "/pools"):
        p.goto(tab.url(path))
        tab.check(path.strip("/").replace("/", "-").replace("@", "-") or "jobs")


def test_see_a_webhook_and_its_deliveries(tab: Page, world: World) -> None:
    hook = world.c.create_webhook(f"http://127.0.0.1:{free_port()}/hook", rules=["webhook_test"])
    world.c.test_webhook(hook["id"])
    deadline = time.monotonic() + 60
    while world.c.list_webhook_deliveries(hook["id"])["deliveries"][0]["attempts"] < 1:
        assert time.monotonic() < deadline, "the test delivery was not attempted"
        time.sleep(0.2)
    p = tab.page
    p.click("nav >> text=Webhooks")
    p.wait_for_selector("#webhooks")
    assert hook["id"] in p.inner_text("#webhooks") and "webhook_test" in p.inner_text("#webhooks")
    tab.check("webhooks")
    p.click(f"#webhooks a:has-text('{hook['id']}')")
    p.wait_for_selector("#deliveries")
    row = p.inner_text("#deliveries tbody tr")
    assert "pending" in row and "1 / 5" in row and "ConnectError" in row
    tab.check("webhook")
