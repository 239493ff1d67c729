"""What `make run` shows: the worked example of DESIGN §4, quoted and explained.

One fine-tuning job whose step time is known on three accelerator families, four pools
(examples/seed-example.yaml, examples/seed-pools.yaml). The quote ranks them by expected cost and the
explanation below the table re-derives every $/step from its parts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trainyard.api_models import JobDocument
from trainyard.catalog.pools import load_pools
from trainyard.cli.quote_cmd import print_quote
from trainyard.client.client import TERMINAL_STATES, TrainyardClient
from trainyard.cost import model as cm
from trainyard.cost.money import format_duration_s, format_usd
from trainyard.cost.quote import QuoteOption, quote
from trainyard.errors import ServiceUnavailableError, TrainyardError
from trainyard.executors.local import pid_alive
from trainyard.settings import Settings, load_settings
from trainyard.spec import load_spec
from trainyard.spec.loader import safe_yaml_load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def explain(o: QuoteOption) -> str:
    base = o.price_usd_per_hour * o.step_time_s / cm.SECONDS_PER_HOUR
    ckpt_pct = o.checkpoint_s / o.checkpoint_interval_s * 100
    head = (
        f"[bold]{o.pool}[/] ({o.accelerator}, {o.market.replace('_', '-')}): "
        f"{format_usd(o.price_usd_per_hour)}/h x {o.step_time_s:g} s/step = {base:.6f} $/step; "
        f"+{ckpt_pct:.2f} % for a {o.checkpoint_s:.1f} s checkpoint "
        f"every {format_duration_s(o.checkpoint_interval_s)}"
    )
    if o.interruption_rate_per_hour > 0:
        rate_s = o.interruption_rate_per_hour / cm.SECONDS_PER_HOUR
        yd = cm.young_daly_interval_s(o.checkpoint_s, rate_s)
        pre_pct = cm.preemption_fraction(o.checkpoint_interval_s, rate_s, o.restart_s) * 100
        head += (
            f"; +{pre_pct:.2f} % for preemptions ({o.interruption_rate_per_hour:g}/h, each losing half an "
            f"interval and {o.restart_s:.0f} s to restart). Interval: Young/Daly "
            f"sqrt(2 x {o.checkpoint_s:.1f} s / {o.interruption_rate_per_hour:g}/h) = {yd:.0f} s "
            f"-> {format_duration_s(o.checkpoint_interval_s)}"
        )
    if o.compile_s:
        head += f"; the first compile ({o.compile_s / 60:.0f} min) is in the expected hours, not in $/step"
    return head + f" -> [bold]{format_usd(o.usd_per_step)}/step[/]."


def show_quote(out: Console) -> int:
    """The worked example of DESIGN §4: quote table and where each number comes from."""
    try:
        spec = load_spec(EXAMPLES / "seed-example.yaml")
        pools = load_pools(EXAMPLES / "seed-pools.yaml")
    except TrainyardError as exc:
        out.print(f"[red]error:[/] {exc.message}")
        return 2
    out.rule("[bold]trainyard[/]: where should this job run, and what will it really cost?")
    params_b = spec.params / 1e9
    out.print(
        f"Job [bold]{spec.name}[/]: {params_b:.2f} B-parameter decoder, full fine-tune in "
        f"{spec.workload.precision.value}, {spec.total_steps:,} steps of {spec.tokens_per_step:,} tokens. "
        f"Checkpoint: {cm.checkpoint_bytes(spec) / 1e9:.1f} GB (bf16 weights + fp32 master + AdamW state), "
        f"written at {cm.storage_write_gb_per_s(spec.checkpoint.storage):g} GB/s."
    )
    options = quote(spec, pools)
    print_quote(
        spec,
        options,
        limit=None,
        out=out,
        title="Quote: examples/seed-example.yaml on examples/seed-pools.yaml",
    )
    out.print("\n[bold]Where the numbers come from[/]")
    for o in options:
        out.print(" - " + explain(o), highlight=False)
    best = options[0]
    out.print(
        f"\nCheapest: [bold]{best.pool}[/] at {format_usd(best.expected_cost_usd)} expected "
        f"({best.expected_hours:.1f} h, p90 {best.expected_hours_p90:.1f} h), "
        f"{format_usd(best.preemption_overhead_usd)} of it lost to preemptions."
    )
    full = [p.name for p in pools if p.free_devices == 0]
    if full:
        out.print(
            f"Pools with no free devices right now ({', '.join(full)}) are still quoted: a quote prices "
            "capacity; the scheduler places jobs on what is free."
        )
    out.print(
        "`trainyard quote examples/seed-example.yaml` prices the same job on the whole packaged "
        "catalog (AWS, GCP, Azure; on-demand, spot, reserved); `trainyard catalog offers` lists the offers; "
        "add `--json` for machine-readable output."
    )
    return 0


# ---- the platform part: a real server, a real CPU job, one injected preemption ----------------------

DEMO_PRICE_USD_PER_DEVICE_HOUR = 0.05
DEMO_STEPS = 60
PID_FILE = "demo-server.json"
UP_COMMAND = (sys.executable, "-m", "trainyard.cli.main", "up")


def demo_job_spec(steps: int = DEMO_STEPS) -> dict[str, Any]:
    """A small real job for the local CPU pool: a 2-layer decoder, checkpointed every couple of seconds."""
    return {
        "apiVersion": "trainyard/v1",
        "kind": "TrainingJob",
        "name": "demo-tiny-decoder",
        "model": {"architecture": "decoder", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab_size": 256},
        "workload": {"seq_len": 128, "global_batch": 16, "steps": steps, "precision": "fp32", "seed": 7},
        "checkpoint": {"interval": "2s", "keep_last": 3},
        "requirements": {"allow": ["cpu"]},
    }


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def any_free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _is_trainyard_up(pid: int) -> bool:
    """Whether ``pid`` is a `trainyard up` process (a pid file can outlive its process and the pid be
    reused by another program, which must never be signalled)."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():
        return True  # no /proc (macOS): trust the pid file
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError:
        return False
    return b"trainyard.cli.main" in args and b"up" in args


def stop_stale_server(home: Path, out: Console) -> None:
    """A demo server left by an earlier run that was interrupted (its pid file survives): stop it."""
    path = home / PID_FILE
    if not path.is_file():
        return
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
    except (ValueError, KeyError, OSError):
        path.unlink(missing_ok=True)
        return
    if pid_alive(pid) and _is_trainyard_up(pid):
        out.print(
            f"A demo server from an earlier run is still up (pid {pid}, {info.get('url')}); stopping it."
        )
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)


def running_server_for(settings: Settings) -> str | None:
    """The URL of a server already serving this TRAINYARD_HOME (it accepts this home's key), or None."""
    import httpx

    key_path = Path(settings.home) / "api_key"
    url = f"http://{settings.host}:{settings.port}"
    if not key_path.is_file() or port_free(settings.host, settings.port):
        return None
    try:
        r = httpx.get(
            f"{url}/v1/whoami",
            headers={"Authorization": f"Bearer {key_path.read_text().strip()}"},
            timeout=2.0,
        )
    except httpx.HTTPError:
        return None
    return url if r.status_code == 200 else None


class DemoServer:
    """`trainyard up` as a background process on this TRAINYARD_HOME."""

    def __init__(self, settings: Settings, out: Console) -> None:
        self.home = Path(settings.home)
        self.host = settings.host
        self.port = settings.port
        if not port_free(self.host, self.port):
            chosen = any_free_port(self.host)
            out.print(f"Port {self.port} is taken on {self.host}; using free port {chosen} instead.")
            self.port = chosen
        self.url = f"http://{self.host}:{self.port}"
        self.log_path = self.home / "demo-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        import httpx

        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TRAINYARD_HOME": str(self.home)}
        env.pop("TRAINYARD_URL", None)
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(
                [*UP_COMMAND, "--host", self.host, "--port", str(self.port), "--loop-interval-s", "0.2"],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.home / PID_FILE).write_text(json.dumps({"pid": self.proc.pid, "url": self.url}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceUnavailableError(
                    f"trainyard up exited with code {self.proc.returncode}",
                    hint=f"See its log: {self.log_path}",
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServiceUnavailableError(
            f"trainyard up did not become ready in {timeout_s:.0f} s", hint=f"See {self.log_path}"
        )

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        (self.home / PID_FILE).unlink(missing_ok=True)
        return self.proc.returncode


def _state_line(doc: JobDocument) -> str:
    reason = f" ({doc['reason']})" if doc.get("reason") else ""
    return f"{doc['state']}{reason}"


def _follow(
    c: TrainyardClient,
    job_id: str,
    total_steps: int,
    out: Console,
    *,
    preempt_at_step: int | None,
    notice_s: float,
    timeout_s: float,
) -> JobDocument:
    """A progress bar fed by the job's heartbeats; state changes printed above it; one preemption."""
    seen_events = 0
    preempted_sent = False
    deadline = time.monotonic() + timeout_s
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[speed]}"),
        TimeElapsedColumn(),
        console=out,
        transient=False,
    ) as bar:
        task = bar.add_task("training", total=total_steps, loss="-", speed="")
        while True:
            doc = c.get_job(job_id)
            page = c.job_events(job_id, after=seen_events)
            for e in page["events"]:
                d = e.get("data") or {}
                if e["kind"] == "state":
                    bar.console.print(
                        f"  state  {d.get('from')} -> [bold]{d.get('to')}[/]: {d.get('reason', '')}"
                    )
                elif e["kind"] == "placement":
                    bar.console.print(
                        f"  placed attempt {d.get('attempt')} on {d.get('pool')} x{d.get('devices')} "
                        f"(${float(d.get('price_usd_per_device_hour') or 0):.2f}/device-h)"
                    )
                elif e["kind"] == "checkpoint":
                    bar.console.print(f"  checkpoint committed at step {d.get('step')}", highlight=False)
                elif e["kind"] in ("preemption_notice", "preempted", "failed", "lost"):
                    bar.console.print(f"  [yellow]{e['kind']}[/] {json.dumps(d, default=str)[:150]}")
                elif e["kind"] == "started" and d.get("resumed_from_step"):
                    bar.console.print(
                        f"  attempt {d.get('attempt')} started (rank {d.get('rank')}, pid {d.get('pid')}), "
                        f"[bold]resumed from step {d.get('resumed_from_step')}[/] of {d.get('total_steps')}"
                    )
            seen_events = page["next_after"]
            prog = doc.get("progress") or {}
            step = int(prog.get("step") or 0)
            loss = prog.get("loss")
            tps = prog.get("tokens_per_s")
            bar.update(
                task,
                completed=min(step, total_steps),
                loss=f"{float(loss):.3f}" if loss is not None else "-",
                speed=f"{float(tps):,.0f} tok/s" if tps else "",
                description=f"training (attempt {doc.get('attempt', 0)})",
            )
            if doc["state"] in TERMINAL_STATES:
                return doc
            if (
                preempt_at_step is not None
                and not preempted_sent
                and doc["state"] == "running"
                and step >= preempt_at_step
            ):
                # the same API call as `trainyard jobs preempt`, made at once: starting a CLI process
                # takes seconds on a busy machine, long enough for this small job to finish first
                bar.console.print(
                    f"  [bold yellow]injecting a preemption at step {step}[/]: "
                    f"trainyard jobs preempt {job_id} --notice-s {notice_s:g}"
                )
                sent = c.preempt_job(job_id, notice_s=notice_s)
                bar.console.print(
                    f"  > {sent['id']}: preemption notice sent; it checkpoints, goes preempted -> queued "
                    "and resumes",
                    highlight=False,
                )
                preempted_sent = True
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"job {job_id} did not finish in {timeout_s:.0f} s (state {doc['state']})",
                    hint=f"See `trainyard jobs get {job_id}` and `trainyard jobs logs {job_id}`.",
                )
            time.sleep(0.25)


def run_platform(out: Console, settings: Settings, *, steps: int = DEMO_STEPS) -> int:
    home = Path(settings.home)
    out.rule("[bold]trainyard up[/]: the platform, a real CPU job and one preemption")
    stop_stale_server(home, out)
    url = running_server_for(settings)
    server: DemoServer | None = None
    if url is not None:
        out.print(
            f"A trainyard server for TRAINYARD_HOME={home} already answers at {url}; the demo uses it "
            "and leaves it running (a second server on the same home would run a second control loop)."
        )
    else:
        server = DemoServer(settings, out)
        url = server.url
        out.print(f"Starting `trainyard up` in the background on {url} (TRAINYARD_HOME={home}) ...")
        server.start()
    api_key = (home / "api_key").read_text().strip()
    code = 0
    try:
        with TrainyardClient(url, api_key, retries=5) as c:
            log_note = f", server log {server.log_path}" if server is not None else ""
            out.print(f"Up: {url}  (api key in {home / 'api_key'}{log_note})")

            # the worked example: quoted against the live pools, placed only where its GPUs exist
            example = safe_yaml_load((EXAMPLES / "seed-example.yaml").read_text())
            example.setdefault("requirements", {})["deny"] = ["cpu"]
            ex_doc = c.submit(example)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                ex_doc = c.get_job(ex_doc["id"])
                if ex_doc["state"] == "queued" and ex_doc.get("reason") not in (None, "admitted"):
                    break
                time.sleep(0.2)
            out.print(
                f"\nSubmitted the worked example as [bold]{ex_doc['id']}[/] "
                "(with `requirements.deny: \\[cpu]`: "
                f"a {load_spec(EXAMPLES / 'seed-example.yaml').params / 1e9:.2f} B-parameter model "
                "on this machine's CPUs would take weeks).\n"
                f"State: {_state_line(ex_doc)}.\n"
                "This server's only pool is this machine's CPUs, so it waits in the queue. Its stored "
                "quote (the packaged cloud catalog) says where it would go:"
            )
            quote_doc = ex_doc.get("quote") or []
            for o in [o for o in quote_doc if o.get("feasible")][:3]:
                out.print(
                    f"  {o.get('pool')}: {o.get('devices')} x {o.get('accelerator')} {o.get('market')}, "
                    f"{format_usd(float(o.get('expected_cost_usd') or 0))} expected, "
                    f"{float(o.get('expected_hours') or 0):.1f} h",
                    highlight=False,
                )
            out.print(
                "Those are planning-only here (no executor of this server serves them); register a pool "
                "of such devices that this machine or a Ray cluster has (`trainyard pools set ...`, backend "
                "local or ray) and the scheduler places it."
            )

            # a nominal price so that the CPU job's cost is not $0 (put back afterwards)
            old_price = c.get_pool("local-cpu").get("price_usd_per_device_hour")
            c.patch_pool("local-cpu", {"price_usd_per_device_hour": DEMO_PRICE_USD_PER_DEVICE_HOUR})
            out.print(
                f"\nThe local-cpu pool costs $0/device-hour by default (the machine is already paid for); "
                f"for this demo it is priced at ${DEMO_PRICE_USD_PER_DEVICE_HOUR}/device-hour through the "
                "pools API (`trainyard pools set local-cpu --price-usd-per-device-hour 0.05`)."
            )
            spec = demo_job_spec(steps)
            job = c.submit(spec)
            job_id = job["id"]
            m = spec["model"]
            out.print(
                f"Submitted [bold]{job_id}[/]: a {m['n_layers']}-layer decoder (d_model {m['d_model']}), "
                f"{steps} steps, checkpoint every {spec['checkpoint']['interval']}, on the local CPU pool."
            )
            at = int(steps * 0.4)
            try:
                final = _follow(c, job_id, steps, out, preempt_at_step=at, notice_s=5.0, timeout_s=600.0)
            finally:
                c.patch_pool("local-cpu", {"price_usd_per_device_hour": float(old_price or 0.0)})
            events = c.job_events(job_id, limit=5000)["events"]
            code = 0 if final["state"] == "succeeded" else 1
            _summary(out, final, events, url, home)
            out.print(f"The local-cpu price is back to ${float(old_price or 0.0):g}/device-hour.")

            c.cancel_job(ex_doc["id"])
            out.print(f"\nCancelled the waiting worked example {ex_doc['id']}, so the next run starts clean.")
    finally:
        if server is not None:
            out.print("Stopping the server (SIGTERM) ...")
            rc = server.stop()
            out.print(f"Server stopped (exit code {rc}). Start it yourself with `trainyard up`.")
    return code


def _summary(out: Console, doc: JobDocument, events: list[Any], url: str, home: Path) -> None:
    job_id = doc["id"]
    out.print(f"\n[bold]{job_id}[/] finished: [bold]{doc['state']}[/] after {doc.get('attempt')} attempts.")
    preempts = [e for e in events if e["kind"] == "preempted"]
    resumed = [e for e in events if e["kind"] == "state" and (e.get("data") or {}).get("from") == "preempted"]
    if preempts:
        d = preempts[0].get("data") or {}
        out.print(
            f"Preempted once (attempt {d.get('attempt')}, checkpoint at step {d.get('checkpoint_step')}), "
            f"requeued {len(resumed)} time(s) and resumed from its last committed checkpoint."
        )
    costs = [e.get("data") or {} for e in events if e["kind"] == "cost"]
    for d in costs:
        price = float(d.get("price_usd_per_device_hour") or 0)
        out.print(
            f"  cost attempt {d.get('attempt')}: {float(d.get('device_s') or 0):.1f} device-s x "
            f"${price:.2f}/device-h = ${float(d.get('usd') or 0):.6f}",
            highlight=False,
        )
    out.print(
        f"Cost: [bold]${float(doc.get('cost_usd') or 0):.6f}[/] (every attempt's device-seconds x the pool "
        "price; the time lost to the preemption is included).",
        highlight=False,
    )
    result = doc.get("result") or {}
    if result:
        out.print(f"Model: {result.get('model_version')}  at {result.get('model_path')}")
        out.print(f"sha256 {result.get('model_sha256')}  (final step {result.get('final_step')})")
    out.print(
        "\nWhere to look next:\n"
        f"  dashboard         {url}/ (after `trainyard up`)\n"
        f"  the job           trainyard jobs get {job_id}\n"
        f"  its events        trainyard jobs events {job_id}\n"
        f"  its training log  trainyard jobs logs {job_id}   ({home / 'runs' / job_id})\n"
        "  a drill           trainyard jobs preempt ID --notice-s 5",
        highlight=False,
    )


def main(argv: list[str] | None = None) -> int:
    out = Console(width=140) if not Console().is_terminal else Console()
    code = show_quote(out)
    if code != 0:
        return code
    out.print()
    try:
        return run_platform(out, load_settings())
    except TrainyardError as exc:
        out.print(f"[red]error:[/] {exc.message}" + (f"\n  hint: {exc.hint}" if exc.hint else ""))
        return 1
    except KeyboardInterrupt:
        out.print("interrupted; the demo server was stopped.")
        return 130


if __name__ == "__main__":
    sys.exit(main())
