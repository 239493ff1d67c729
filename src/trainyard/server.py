"""`trainyard up`: the API, the control loop (admission, scheduling, executor events) and the executor in
one process, on embedded defaults. SIGINT/SIGTERM stop it gracefully: in-flight requests finish, the
loop stops between ticks, and the database is closed. Workers of running jobs are left to the executor's
shutdown policy; a restart reconciles them (adopts live ones, requeues the rest).
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from trainyard.errors import InvalidInputError, PortInUseError, ServiceUnavailableError
from trainyard.settings import Settings


def configure_logging(level: str | int = "info") -> None:
    """Structured logs on stderr: JSON, or readable lines on a terminal (``observability.logging``)."""
    from trainyard.observability.logging import configure_logging as configure

    configure(level)


_BACKENDS = {
    "local": ("trainyard.executors.local", "LocalExecutor"),
    "ray": ("trainyard.executors.ray", "RayExecutor"),
}


def make_executor(settings: Settings, name: str | None = None) -> Any:
    """The executor backend named by ``name`` (or TRAINYARD_EXECUTOR): ``local``, ``ray`` or ``none``."""
    import importlib

    which = (name or settings.executor or "local").lower()
    if which == "none":
        return None
    if which not in _BACKENDS:
        raise InvalidInputError(f"unknown executor {which!r}", hint="Use one of: local, ray, none.")
    if which == "local":
        from trainyard.executors.local import LocalExecutor

        return LocalExecutor(sandbox=make_sandbox(settings))
    module_name, class_name = _BACKENDS[which]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ServiceUnavailableError(
            f"the {which} executor is not available in this installation ({exc})",
            hint="Start with --executor none to accept and queue jobs without running them.",
        ) from exc
    if which == "ray":  # each node builds the sandbox for the workers it starts
        return getattr(module, class_name)(settings=settings, sandbox=sandbox_spec(settings))
    return _construct(getattr(module, class_name), settings)


def sandbox_spec(settings: Settings) -> Any:
    """The sandbox workers run in (TRAINYARD_SANDBOX), as a description any machine builds: ``bwrap``
    (default) or ``none``, the explicit opt-out, which is logged loudly (None)."""
    which = (settings.sandbox or "bwrap").lower()
    if which == "none":
        structlog.get_logger("trainyard.server").warning(
            "sandbox_disabled", detail="TRAINYARD_SANDBOX=none: workers run as the server's user"
        )
        return None
    if which != "bwrap":
        raise InvalidInputError(f"unknown sandbox {which!r}", hint="Use TRAINYARD_SANDBOX=bwrap or none.")
    from trainyard.executors.sandbox import SandboxSpec

    return SandboxSpec()


def make_sandbox(settings: Settings) -> Any:
    """The sandbox of this machine's workers (SandboxUnavailableError when it cannot start here), or
    None under ``TRAINYARD_SANDBOX=none``."""
    spec = sandbox_spec(settings)
    return None if spec is None else spec.build()


def _construct(cls: Any, settings: Settings) -> Any:
    try:
        return cls(settings=settings)
    except TypeError:
        return cls()


def default_schedule_round() -> Any:
    """The queue-wide optimiser when it is installed, else the greedy cheapest-feasible round."""
    try:
        from trainyard.services.scheduler_adapter import OptimizerRound
    except ImportError:
        return None
    try:
        return OptimizerRound()
    except Exception:
        return None


def _installed(module: str) -> str | None:
    import importlib.util

    return module if importlib.util.find_spec(module) is not None else None


def _graceful_server_class() -> Any:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """Stops on SIGINT/SIGTERM like uvicorn, but returns normally instead of re-raising the signal
        afterwards, so the platform shuts down (loop stopped, executor detached, database closed) and the
        process exits 0. A second SIGINT still forces the exit."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    return GracefulServer


def _measure_cpu_at_first_start(settings: Settings, executor: Any, log: Any) -> None:
    """At the first start of a server that runs CPU jobs (no CPU profile stored yet), time a few real
    steps of two small decoders on this CPU in the background; the quoter picks the profiles up as soon
    as they are stored, so the first CPU quote uses this machine's measured speed
    (``TRAINYARD_PROFILE_AT_START=0`` turns it off)."""
    import os
    import threading

    from trainyard.services.profiles import has_cpu_profile, measure_local_cpu

    if os.environ.get("TRAINYARD_PROFILE_AT_START", "1") in ("0", "false", "no"):
        return
    if getattr(executor, "name", None) != "local" or has_cpu_profile(settings.home):
        return

    def run() -> None:
        paths = measure_local_cpu(settings.home)
        log.info("cpu_profiled_at_first_start", profiles=[str(p) for p in paths])

    threading.Thread(target=run, name="first-start-profile", daemon=True).start()


def _start_mlflow_mirror(settings: Settings, platform: Any) -> Any:
    """The MLflow mirror's thread when TRAINYARD_MLFLOW_TRACKING_URI is set (docs/interop.md)."""
    if not settings.mlflow_tracking_uri:
        return None
    from trainyard.services.mlflow_mirror import MlflowMirror

    mirror = MlflowMirror(
        platform.db, settings.mlflow_tracking_uri, cursor_path=settings.home / "mlflow-mirror.json"
    )
    mirror.start()
    return mirror


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts, so a busy port is one clear error (and
    the port in server.json is the one really bound, also for ``--port 0``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"port {port} on {host} is already in use",
                hint="Another `trainyard up`? See `trainyard status`; or start on a free port with --port N.",
                details={"host": host, "port": port},
            ) from None
        raise ServiceUnavailableError(
            f"cannot listen on {host}:{port}: {exc.strerror}", hint="Pick another --host or --port."
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    executor: str | None = None,
    loop_interval_s: float = 0.5,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. Once it listens, ``$TRAINYARD_HOME/server.json`` records where (url,
    pid, port, started_at; mode 0600) and ``on_ready`` gets that record; the file is removed on exit."""
    from trainyard import serverfile
    from trainyard.api.app import create_app
    from trainyard.services.platform import Platform, PlatformOptions

    os.umask(0o077)  # everything the server creates under TRAINYARD_HOME is its own (0600 / 0700)
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    configure_logging(settings.log_level)
    log = structlog.get_logger("trainyard.server")
    options = PlatformOptions(
        executor=make_executor(settings, executor),
        schedule_round=default_schedule_round(),
        loop_interval_s=loop_interval_s,
    )
    platform = Platform(settings, options)
    if platform.supervisor is not None:
        platform.supervisor.restart_backoff = True  # failure restarts wait RestartPolicy.backoff_s
    try:
        platform.start()
        app = create_app(platform)
        import uvicorn

        _GracefulServer = _graceful_server_class()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            # "auto": uvloop and the httptools parser (pinned dependencies) when importable, else asyncio
            # and h11; together they take ~20 % off the CPU time of a submission (docs/benchmarks.md).
            loop="auto",
            http="auto",
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
        )
        server = _GracefulServer(config)
        # Everything allocated during start-up (modules, catalog, app) lives as long as the process: move
        # it out of the collector's generations so that a full collection under load walks only what
        # requests allocate (shorter GC pauses, i.e. a lower p99).
        gc.collect()
        gc.freeze()
        platform.start_loop()
        _measure_cpu_at_first_start(settings, options.executor, log)
        mirror = _start_mlflow_mirror(settings, platform)
        url_host = f"[{host}]" if ":" in host else host
        record = {
            "url": f"http://{url_host}:{port}",
            "pid": os.getpid(),
            "port": port,
            "host": host,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "home": str(settings.home),
            "api_key_file": str(settings.api_key_path),
            "executor": getattr(options.executor, "name", "none"),
        }
        serverfile.write(record, settings.home)
        log.info(
            "listening",
            url=f"http://{host}:{port}",
            home=str(settings.home),
            database=platform.db.dialect,
            api_key_file=str(settings.api_key_path),
            executor=getattr(options.executor, "name", "none"),
            http=_installed("httptools") or "h11",
            loop=_installed("uvloop") or "asyncio",
        )
        if on_ready is not None:
            on_ready(record)
        server.run(sockets=[sock])
        if mirror is not None:
            mirror.stop()
    finally:
        serverfile.remove_if_mine(os.getpid(), settings.home)
        sock.close()
        platform.close()
        log.info("stopped")
