"""Ray executor: run a gang on an existing Ray cluster, one actor per rank inside a placement group.

The control plane connects to the cluster as a driver (``ray.init(address=...)``: a node address such
as ``10.0.0.5:6379`` on a cluster machine, or ``ray://head:10001`` from outside). Pools are Ray node
resources: a node that offers pool ``P`` carries ``trainyard/pool:P`` (one unit per device) and
optionally ``trainyard/accelerator:<name>``; docs/ray.md shows how to label nodes.

A gang is a placement group with one bundle per rank (``STRICT_PACK`` when one node of the pool holds
the whole gang, ``PACK`` otherwise), so it starts all at once or waits: a gang that does not fit stays
pending, it never starts partially. Once placed, each bundle gets a ``RankHost`` actor (ray_actor.py)
that runs the ordinary worker (``python -m trainyard.runtime.worker``) as a subprocess; rank 0's
node address and a free port on it are the ``torch.distributed`` rendezvous (gloo).

Events and logs: workers write their JSON-lines event files and logs on their own node; ``poll()``
keeps one non-blocking ``drain`` call in flight per rank and appends what comes back to the same files
in the job's ``run_dir`` on the control plane (byte-identical copies), so the control plane sees the
same events, in the same files, as with the local executor, and no shared ``run_dir`` is needed.

Failures: an actor whose node dies (``ActorDiedError``), a rank that exits without a terminal event, or
one that stops sending events for ``heartbeat_timeout_s``, makes the attempt ``lost``: the gang is torn
down (actors killed, placement group removed) and one ``lost`` event is reported; the service resumes
the job from its last committed checkpoint wherever the scheduler places it next. Checkpoints must live
where every node reads and writes them: ``launch`` refuses storage that is local to one machine
(``file://`` outside the configured shared paths) with a :class:`~trainyard.errors.StorageError`, and
each rank checks on its node that it reads a probe file the executor wrote there.

Sandbox: with a :class:`~trainyard.executors.sandbox.SandboxSpec` (the server passes the one of
``TRAINYARD_SANDBOX``, bubblewrap by default, as for the local executor) every rank's actor builds the
sandbox on its node and starts its worker inside it (ray_actor.py); a node where bubblewrap cannot
start reports it in ``hello`` and the attempt fails (infrastructure) before any worker starts. The
``started`` event then carries the host pid of the rank's sandbox (``pid_in_sandbox``: the worker's
own, in its pid namespace), which is what the service records and an adoption watches. A gang's ranks
share their nodes' network (the collectives), so they reach every port of the cluster: with a sandbox
the executor connects only to a cluster that requires Ray's token authentication
(``unauthenticated_cluster``: this process in ``RAY_AUTH_MODE=token``, the GCS refusing a call without
the token), and the token never enters a sandbox (ray_actor.py).

Control-plane restarts: actors and placement groups are detached and named
(``<job>/a<attempt>/r<rank>`` in the ``trainyard`` namespace), so ``adopt`` finds them again; an actor
that nobody drains for ``orphan_timeout_s`` stops its worker and releases its placement group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainyard.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    ServiceUnavailableError,
    StorageError,
)
from trainyard.executors.base import (
    CLASSIFICATION_INFRA,
    PASS_THROUGH_KINDS,
    WORKER_TERMINAL_KINDS,
    ExecutorEvent,
    LaunchRequest,
    RankEnd,
    WorkerInfo,
    event_file_name,
    first_abnormal,
    gang_outcome,
    launch_file_name,
    launch_request_to_dict,
    note_exits,
    notice_file_name,
    rank_log_name,
    wait_for_terminal,
)
from trainyard.executors.sandbox import SandboxSpec, job_env

log = logging.getLogger("trainyard.executors.ray")

POOL_RESOURCE_PREFIX = "trainyard/pool:"
ACCELERATOR_RESOURCE_PREFIX = "trainyard/accelerator:"
DEFAULT_NAMESPACE = "trainyard"
SHARED_PATHS_ENV = "TRAINYARD_RAY_SHARED_PATHS"
LOCAL_SCHEMES = ("", "file", "local")
MACHINE_LOCAL_SCHEMES = ("memory",)  # process memory: not even another process reads it
PROBE_PREFIX = ".trainyard-probe"


# ---- pure helpers (no Ray) ---------------------------------------------------------------------------


def pool_resource(pool: str) -> str:
    """The Ray node resource that marks capacity of trainyard pool ``pool`` (one unit per device)."""
    return f"{POOL_RESOURCE_PREFIX}{pool}"


def accelerator_resource(accelerator: str) -> str:
    return f"{ACCELERATOR_RESOURCE_PREFIX}{accelerator}"


def shared_paths_from_env(value: str | None) -> list[str]:
    """``TRAINYARD_RAY_SHARED_PATHS``: directories mounted on every node (``:`` or ``,`` separated)."""
    if not value:
        return []
    return [p for p in value.replace(",", os.pathsep).split(os.pathsep) if p.strip()]


def shared_storage_problem(url: str, shared_paths: list[str]) -> str | None:
    """Why ``url`` is not checkpoint storage every node of a cluster reaches, or None when it is.

    Object stores and other remote filesystems (``s3://``, ``gs://``, ``az://``, ``hdfs://``, …) are
    shared. A local path (``file://`` or a bare path) is shared only under one of ``shared_paths`` — the
    operator's statement that the directory is the same mount (NFS, a PVC, …) on every node.
    """
    if not url:
        return "no checkpoint storage URL was given"
    protocol = url.split("::")[-1]  # fsspec chains: the last element is the target filesystem
    scheme = urlsplit(protocol).scheme.lower() if "://" in protocol else ""
    if scheme in MACHINE_LOCAL_SCHEMES:
        return f"{scheme}:// storage lives in one process's memory"
    if scheme not in LOCAL_SCHEMES:
        return None
    path = urlsplit(protocol).path if scheme else protocol
    if not path.startswith("/"):
        return f"{url} is a relative path, which means something different on every node"
    target = Path(os.path.normpath(path))
    for shared in shared_paths:
        root = Path(os.path.normpath(shared))
        if target == root or root in target.parents:
            return None
    where = f" (shared paths: {', '.join(shared_paths)})" if shared_paths else " (no shared paths configured)"
    return f"{url} is a path on one machine, not storage every Ray node reaches{where}"


def check_shared_storage(url: str, shared_paths: list[str]) -> None:
    """Raise :class:`StorageError` when ``url`` is not storage every node of the cluster reaches."""
    problem = shared_storage_problem(url, shared_paths)
    if problem is not None:
        raise StorageError(
            f"the Ray executor refuses checkpoint storage {url!r}: {problem}",
            hint=(
                "Use an object store URL (s3://, gs://, az://) or a filesystem mounted at the same path "
                f"on every node and listed in {SHARED_PATHS_ENV}; see docs/ray.md."
            ),
            details={"checkpoint_url": url, "shared_paths": list(shared_paths)},
        )


def bundle_for(
    pool: str, nodes: list[dict[str, float]], *, cpus_per_rank: float
) -> tuple[dict[str, float], int]:
    """(one rank's bundle, the most ranks one node of the pool holds) from alive nodes' resources.

    A rank takes one unit of the pool resource and ``cpus_per_rank`` CPUs; when every node of the pool
    carries the same ``trainyard/accelerator:<name>`` label it takes one unit of that too, and one
    ``GPU`` when the pool's nodes have GPUs (so Ray sets ``CUDA_VISIBLE_DEVICES`` for the rank).
    """
    res = pool_resource(pool)
    bundle: dict[str, float] = {res: 1.0}
    if cpus_per_rank > 0:
        bundle["CPU"] = float(cpus_per_rank)
    members = [n for n in nodes if n.get(res, 0.0) >= 1.0]
    if not members:
        return bundle, 0
    labels = [{k for k in n if k.startswith(ACCELERATOR_RESOURCE_PREFIX)} for n in members]
    common = set.intersection(*labels) if labels else set()
    if len(common) == 1:
        bundle[next(iter(common))] = 1.0
    if all(n.get("GPU", 0.0) >= 1.0 for n in members):
        bundle["GPU"] = 1.0

    def fits(n: dict[str, float]) -> int:
        return int(min(n.get(k, 0.0) // v for k, v in bundle.items() if v > 0))

    return bundle, max(fits(n) for n in members)


def placement_strategy(world_size: int, ranks_per_node: int) -> str:
    """``STRICT_PACK`` when one node of the pool holds the whole gang, else ``PACK`` (fewest nodes)."""
    return "STRICT_PACK" if world_size <= max(1, ranks_per_node) and ranks_per_node > 0 else "PACK"


def actor_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}/a{attempt}/r{rank}"


def placement_group_name(job_id: str, attempt: int) -> str:
    return f"trainyard/{job_id}/a{attempt}"


# ---- state ---------------------------------------------------------------------------------------------


@dataclass
class _Rank:
    rank: int
    actor: Any = None
    hello: dict[str, Any] | None = None
    pid: int | None = None
    start_ref: Any = None
    drain_ref: Any = None
    drain_sent_s: float = 0.0
    event_offset: int = 0
    log_offset: int = 0
    last_seen_s: float | None = None
    exited: bool = False
    exit_code: int | None = None
    terminal: dict[str, Any] | None = None
    unreported: str | None = None  # how it ended without a terminal event (died, node lost)
    actor_dead: bool = False
    partial: bytes = b""

    @property
    def host(self) -> str:
        return str((self.hello or {}).get("node_ip") or "")


@dataclass
class _Gang:
    job_id: str
    attempt: int
    run_dir: Path
    world_size: int
    pool: str
    doc: dict[str, Any]  # the launch request as a dict (env filled with the rendezvous when known)
    ranks: list[_Rank]
    launched_s: float
    entrypoint: bool
    pg: Any = None
    pg_ready: Any = None
    phase: str = "placing"  # placing → hello → running
    placed_s: float | None = None
    hello_refs: list[Any] = field(default_factory=list)
    probe_url: str | None = None
    probe_token: str | None = None
    pending_logged: bool = False
    adopted_at_s: float | None = None
    preempt_deadline_s: float | None = None
    trigger: tuple[str, dict[str, Any]] | None = None
    teardown_at_s: float | None = None
    kill_deadline_s: float | None = None
    cancelled: bool = False
    killed: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Closing:
    refs: list[Any]
    actors: list[Any]
    pg: Any
    deadline_s: float


class RayExecutor:
    """The Executor protocol on a Ray cluster. See the module docstring for the design."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        settings: Any = None,
        namespace: str = DEFAULT_NAMESPACE,
        shared_paths: list[str] | None = None,
        cpus_per_rank: float = 1.0,
        heartbeat_timeout_s: float = 60.0,
        startup_timeout_s: float = 300.0,
        failure_grace_s: float = 3.0,
        preempt_grace_s: float = 2.0,
        drain_wait_s: float = 0.2,
        pending_log_after_s: float = 5.0,
        orphan_timeout_s: float = 1800.0,
        extra_env: dict[str, str] | None = None,
        python: str | None = None,
        strategy: str | None = None,
        connect: bool = True,
        sandbox: SandboxSpec | None = None,
    ):
        if address is None and settings is not None:
            address = getattr(settings, "ray_address", None)
        address = address or os.environ.get("TRAINYARD_RAY_ADDRESS") or None
        if shared_paths is None:
            configured = getattr(settings, "ray_shared_paths", None) if settings is not None else None
            if isinstance(configured, str):
                shared_paths = shared_paths_from_env(configured)
            elif configured:
                shared_paths = [str(p) for p in configured]
            else:
                shared_paths = shared_paths_from_env(os.environ.get(SHARED_PATHS_ENV))
        self.address = address
        self.namespace = namespace
        self.shared_paths = list(shared_paths)
        self.cpus_per_rank = cpus_per_rank
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.failure_grace_s = failure_grace_s
        self.preempt_grace_s = preempt_grace_s
        self.drain_wait_s = drain_wait_s
        self.pending_log_after_s = pending_log_after_s
        self.orphan_timeout_s = orphan_timeout_s
        self.extra_env = dict(extra_env or {})
        self.python = python
        self.strategy = strategy
        # every rank's worker in bubblewrap, built on its own node (executors.sandbox); None: bare
        self.sandbox = sandbox
        self._gangs: dict[str, _Gang] = {}
        self._closing: list[_Closing] = []
        self._lock = threading.RLock()
        self._owns_connection = False
        self._actor_cls: Any = None
        self.open_exporters: list[str] = []  # Ray exporters that answered without credentials at connect
        if connect:
            self._connect()

    # ---- connection ---------------------------------------------------------------------------------
    def _connect(self) -> None:
        if not self.address:
            raise InvalidInputError(
                "the Ray executor needs the address of a running Ray cluster",
                hint="Pass --ray-address HOST:6379 (or ray://HOST:10001), or set TRAINYARD_RAY_ADDRESS.",
            )
        import ray

        problem = _unreachable(self.address)
        if problem is not None:  # ray.init would retry for minutes; say it now
            raise ServiceUnavailableError(
                f"cannot connect to the Ray cluster at {self.address}: {problem}",
                hint="Start the cluster with `ray start --head` (docs/ray.md) and check the address.",
            )
        if self.sandbox is not None:
            # sandboxed ranks of a gang share their node's network (collectives): only the cluster's
            # token keeps tenant code from being a Ray client of it
            unauthenticated = unauthenticated_cluster(self.address)
            if unauthenticated is not None:
                raise ServiceUnavailableError(
                    f"the Ray cluster at {self.address} must require token authentication: {unauthenticated}",
                    hint="Start every node and the server with RAY_AUTH_MODE=token and the cluster's "
                    "token in RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token (docs/ray.md), or run without "
                    "the sandbox (TRAINYARD_SANDBOX=none) on a cluster no tenant code reaches.",
                )
        if not ray.is_initialized():  # else this process is already a driver (embedding application, tests)
            try:
                ray.init(
                    address=self.address,
                    namespace=self.namespace,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    configure_logging=False,
                )
            except Exception as exc:  # ConnectionError, RuntimeError, TimeoutError, ValueError, ...
                raise ServiceUnavailableError(
                    f"cannot connect to the Ray cluster at {self.address}: {exc}",
                    hint="Start the cluster with `ray start --head` (docs/ray.md) and check the address.",
                ) from exc
            self._owns_connection = True
        if self.sandbox is not None and "://" not in self.address:
            self._check_exporters()

    def _check_exporters(self) -> None:
        """Warn when the cluster runs Ray's Prometheus exporters where they answer without credentials:
        sandboxed ranks share the nodes' network and could read them (docs/ray.md, "Metrics")."""
        try:
            self.open_exporters = open_metrics_exporters(metrics_exporter_addresses())
        except Exception as exc:  # never a reason not to start
            log.warning("could not check the Ray cluster's metrics exporters: %s", _short(exc))
            return
        if self.open_exporters:
            log.warning(
                "the Ray cluster's metrics exporters at %s answer without credentials, so tenant code on "
                "its nodes can read every tenant's Ray metrics; start the nodes without them "
                "(RAY_enable_metrics_collection=0 AUTOSCALER_METRIC_PORT=-1 DASHBOARD_METRIC_PORT=-1) or "
                "firewall them from the sandbox uid (docs/ray.md, Metrics)",
                ", ".join(self.open_exporters),
            )

    def _actor_class(self) -> Any:
        if self._actor_cls is None:
            import ray

            from trainyard.executors.ray_actor import RankHost

            self._actor_cls = ray.remote(RankHost)
        return self._actor_cls

    def serves(self, pool: Any) -> bool:
        """A pool with backend ``ray`` (or none given) whose label ``trainyard/pool:<name>`` some alive node
        carries (the node list is cached for a few seconds; the scheduler asks every round)."""
        if pool.backend not in (None, "ray"):
            return False
        now = time.monotonic()
        cached = getattr(self, "_labels_cache", None)
        if cached is None or now - cached[0] > 5.0:
            nodes = self.cluster_nodes()
            labels = {k for n in nodes for k in n["resources"] if k.startswith(POOL_RESOURCE_PREFIX)}
            cached = (now, labels)
            self._labels_cache = cached
        return pool_resource(pool.name) in cached[1]

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """Alive nodes: ``{node_id, ip, resources}``."""
        import ray

        return [
            {"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "resources": dict(n["Resources"])}
            for n in ray.nodes()
            if n.get("Alive")
        ]

    def cluster_state(self) -> dict[str, Any]:
        """What the cluster holds, read over this driver's authenticated connection: every node the GCS
        knows (``{node_id, ip, alive, resources}``, total resources of each) and the resources free
        across the cluster now. The API server re-exports it behind its ``/metrics`` credentials
        (``observability.ray_metrics``), in place of Ray's own exporters, which answer anyone."""
        import ray

        nodes = [
            {
                "node_id": str(n["NodeID"]),
                "ip": str(n["NodeManagerAddress"]),
                "alive": bool(n.get("Alive")),
                "resources": {str(k): float(v) for k, v in (n.get("Resources") or {}).items()},
            }
            for n in ray.nodes()
        ]
        available = {str(k): float(v) for k, v in ray.available_resources().items()}
        return {"nodes": nodes, "available": available}

    # ---- launch -------------------------------------------------------------------------------------
    def check_storage(self, checkpoint_url: str) -> None:
        """Raise :class:`StorageError` unless every node of the cluster reaches ``checkpoint_url``."""
        check_shared_storage(checkpoint_url, self.shared_paths)

    def launch(self, req: LaunchRequest) -> list[WorkerInfo]:
        """Reserve the gang (a placement group) and return at once; ``poll()`` starts the ranks once
        the whole gang is placed. Workers have no pid until then."""
        import ray
        from ray.util.placement_group import placement_group

        with self._lock:
            if req.job_id in self._gangs:
                raise ConflictError(
                    f"job {req.job_id} already has a gang on the Ray executor "
                    f"(attempt {self._gangs[req.job_id].attempt})",
                    hint="Cancel or wait for the running attempt before launching another.",
                )
            if req.world_size < 1:
                raise ValueError("world_size must be >= 1")
            self.check_storage(req.checkpoint_url)
            probe_url, token = self._write_probe(req)
            run_dir = Path(req.run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            doc = launch_request_to_dict(req)
            env = {**self.extra_env, **dict(req.env)}
            doc["env"] = env if self.sandbox is None else job_env(env)  # no server setting reaches a node
            _write_json(run_dir / launch_file_name(req.attempt), doc)
            nodes = [n["resources"] for n in self.cluster_nodes()]
            bundle, per_node = bundle_for(req.pool, nodes, cpus_per_rank=self.cpus_per_rank)
            strategy = self.strategy or placement_strategy(req.world_size, per_node)
            name = placement_group_name(req.job_id, req.attempt)
            with contextlib.suppress(Exception):  # a leftover from a crashed control plane
                stale = ray.util.get_placement_group(name)
                ray.util.remove_placement_group(stale)
            pg = placement_group(
                [dict(bundle) for _ in range(req.world_size)],
                strategy=strategy,
                name=name,
                lifetime="detached",
            )
            gang = _Gang(
                job_id=req.job_id,
                attempt=req.attempt,
                run_dir=run_dir,
                world_size=req.world_size,
                pool=req.pool,
                doc=doc,
                ranks=[_Rank(r) for r in range(req.world_size)],
                launched_s=time.time(),
                entrypoint=bool((req.spec.get("entrypoint") or {}).get("command")),
                pg=pg,
                pg_ready=pg.ready(),
                probe_url=probe_url,
                probe_token=token,
            )
            for r in range(req.world_size):
                with open(run_dir / rank_log_name(r), "ab") as fh:
                    fh.write(_log_header(req.attempt, r, f"pool {req.pool}, {strategy}"))
            self._gangs[req.job_id] = gang
            log.info(
                "ray gang requested job=%s attempt=%s bundle=%s strategy=%s",
                req.job_id,
                req.attempt,
                bundle,
                strategy,
            )
            return [WorkerInfo(r, None, "") for r in range(req.world_size)]

    def _write_probe(self, req: LaunchRequest) -> tuple[str, str]:
        from trainyard.runtime.storage import atomic_write_bytes, join_url, url_to_fs

        token = uuid.uuid4().hex
        job_url = join_url(req.checkpoint_url, req.job_id)
        probe_url = join_url(job_url, f"{PROBE_PREFIX}-a{req.attempt}")
        try:
            fs, path = url_to_fs(job_url)
            fs.makedirs(path, exist_ok=True)
            atomic_write_bytes(fs, url_to_fs(probe_url)[1], token.encode())
        except Exception as exc:
            raise StorageError(
                f"cannot write to checkpoint storage {req.checkpoint_url!r}: {exc}",
                details={"checkpoint_url": req.checkpoint_url},
            ) from exc
        return probe_url, token

    @staticmethod
    def _remove_probe(gang: _Gang) -> None:
        if gang.probe_url is None:
            return
        from trainyard.runtime.storage import url_to_fs

        with contextlib.suppress(Exception):
            fs, path = url_to_fs(gang.probe_url)
            fs.rm(path)
        gang.probe_url = None

    # ---- control ------------------------------------------------------------------------------------
    def preempt(self, job_id: str, notice_s: float) -> None:
        """Deliver a preemption notice to every rank (deadline file on its node, then SIGTERM)."""
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is None:
                raise NotFoundError(f"no running gang for job {job_id} on the Ray executor")
            now = time.time()
            deadline = now + max(0.0, notice_s)
            _write_json(
                gang.run_dir / notice_file_name(gang.attempt),
                {"deadline_time_s": deadline, "notice_s": notice_s},
            )
            gang.preempt_deadline_s = deadline + self.preempt_grace_s
            if gang.phase != "running":
                self._kill(gang)  # nothing trains yet: release the reservation now
                return
            for rk in gang.ranks:
                if not rk.exited and rk.actor is not None:
                    rk.actor.preempt.remote(deadline, notice_s)

    def cancel(self, job_id: str) -> None:
        """Stop every rank now and release the placement group; no terminal event is reported."""
        import ray

        with self._lock:
            gang = self._gangs.pop(job_id, None)
            if gang is None:
                return
            gang.cancelled = True
            refs = [
                rk.actor.close.remote() for rk in gang.ranks if rk.actor is not None and not rk.actor_dead
            ]
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=10.0)
            self._release(gang, [])
            self._remove_probe(gang)

    def workers(self, job_id: str) -> list[WorkerInfo]:
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is None:
                return []
            return [
                WorkerInfo(rk.rank, rk.pid, rk.host)
                for rk in gang.ranks
                if rk.pid is not None and not rk.exited
            ]

    def placement(self, job_id: str) -> list[dict[str, Any]]:
        """Where each rank of the job's running gang landed: ``{rank, node_id, node_ip, pid}``."""
        with self._lock:
            gang = self._gangs.get(job_id)
            if gang is None:
                return []
            return [
                {
                    "rank": rk.rank,
                    "node_id": (rk.hello or {}).get("node_id"),
                    "node_ip": (rk.hello or {}).get("node_ip"),
                    "pid": rk.pid,
                }
                for rk in gang.ranks
            ]

    def phase(self, job_id: str) -> str | None:
        """``placing`` (waiting for the whole gang to fit), ``hello``, ``running``, or None."""
        with self._lock:
            gang = self._gangs.get(job_id)
            return None if gang is None else gang.phase

    def adopt(self, job_id: str, attempt: int, run_dir: str, workers: list[WorkerInfo]) -> bool:
        """Resume watching a gang started by an earlier control plane (its actors are detached and
        named). Events the earlier control plane did not mirror yet are delivered; False when the
        actors are gone."""
        import ray

        with self._lock:
            if job_id in self._gangs:
                return True
            rd = Path(run_dir)
            try:
                doc = json.loads((rd / launch_file_name(attempt)).read_text())
            except (OSError, ValueError):
                return False
            world = int(doc.get("world_size") or len(workers) or 0)
            if world < 1:
                return False
            ranks = []
            for r in range(world):
                try:
                    actor = ray.get_actor(actor_name(job_id, attempt, r), namespace=self.namespace)
                except ValueError:
                    return False
                rk = _Rank(r, actor=actor)
                rk.event_offset = _size(rd / event_file_name(attempt, r))
                rk.log_offset = _mirrored_log_bytes(rd / rank_log_name(r), attempt, r)
                ranks.append(rk)
            known = {w.rank: w for w in workers}
            for rk in ranks:
                w = known.get(rk.rank)
                if w is not None:
                    rk.pid = w.pid
                    rk.hello = {"node_ip": w.host}
            pg = None
            with contextlib.suppress(Exception):
                pg = ray.util.get_placement_group(placement_group_name(job_id, attempt))
            now = time.time()
            gang = _Gang(
                job_id=job_id,
                attempt=attempt,
                run_dir=rd,
                world_size=world,
                pool=str(doc.get("pool", "")),
                doc=doc,
                ranks=ranks,
                launched_s=now,
                entrypoint=bool(((doc.get("spec") or {}).get("entrypoint") or {}).get("command")),
                pg=pg,
                phase="running",
                placed_s=now,
                adopted_at_s=now,
            )
            for rk in ranks:
                rk.last_seen_s = now
            self._gangs[job_id] = gang
            return True

    def shutdown(self, *, kill_workers: bool = False) -> None:
        """Stop watching. Gangs keep running (detached; a later control plane adopts them) unless
        ``kill_workers``; the driver connection is closed when this executor opened it."""
        with self._lock:
            if kill_workers:
                for job_id in list(self._gangs):
                    self.cancel(job_id)
            else:
                for gang in self._gangs.values():
                    if gang.phase == "placing":  # not started: nothing to adopt later
                        self._release(gang, [])
            self._gangs.clear()
            self._reap_closing(force=True)
            if self._owns_connection:
                import ray

                with contextlib.suppress(Exception):
                    ray.shutdown()
                self._owns_connection = False

    # ---- watching -----------------------------------------------------------------------------------
    def poll(self) -> list[ExecutorEvent]:
        out: list[ExecutorEvent] = []
        with self._lock:
            for job_id in list(self._gangs):
                gang = self._gangs[job_id]
                try:
                    out.extend(self._poll_gang(gang))
                except Exception:  # one gang's trouble must not stop the others being watched
                    log.exception("ray executor poll failed for job %s", job_id)
            self._reap_closing()
        return out

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.05) -> list[ExecutorEvent]:
        """Poll until ``job_id`` reports a terminal event (or ``timeout_s``); every event seen."""
        return wait_for_terminal(self.poll, lambda: job_id in self._gangs, job_id, timeout_s, poll_s)

    def _poll_gang(self, gang: _Gang) -> list[ExecutorEvent]:
        import ray

        out: list[ExecutorEvent] = []
        now = time.time()
        if gang.phase == "placing":
            ready, _ = ray.wait([gang.pg_ready], timeout=0)
            if not ready:
                if not gang.pending_logged and now - gang.launched_s >= self.pending_log_after_s:
                    gang.pending_logged = True
                    out.append(self._event(gang, "log", {"message": self._pending_reason(gang)}))
                if gang.preempt_deadline_s is None:
                    return out
            else:
                self._create_actors(gang)
        if gang.phase == "hello" and not gang.killed:
            self._advance_hello(gang, out)
        for rk in gang.ranks:
            if rk.start_ref is not None:
                self._advance_start(gang, rk)
            if rk.actor is not None and not rk.exited and gang.phase == "running":
                self._drain(gang, rk, now, out)
        self._observe(gang, now)
        if gang.killed and gang.kill_deadline_s is not None and now >= gang.kill_deadline_s:
            for rk in gang.ranks:  # actors that did not confirm their worker's end in time
                if not rk.exited:
                    self._kill_actor(rk)
                    rk.exited = True
        if not all(rk.exited for rk in gang.ranks):
            return out
        # every rank is gone: report exactly one terminal event and release the resources
        self._gangs.pop(gang.job_id, None)
        self._release(gang, [rk for rk in gang.ranks if rk.actor is not None and not rk.actor_dead])
        self._remove_probe(gang)
        if gang.cancelled:
            return out
        kind, data = gang_outcome(
            [RankEnd(rk.rank, rk.terminal, rk.unreported, node_ip=rk.host) for rk in gang.ranks],
            failures=gang.failures,
            trigger=gang.trigger,
            entrypoint=gang.entrypoint,
            preempting=gang.preempt_deadline_s is not None,
            preempt_overrides_trigger=gang.phase != "running",  # notice before the gang ran: preempted
        )
        out.append(self._event(gang, kind, data))
        return out

    def _pending_reason(self, gang: _Gang) -> str:
        try:
            nodes = [n["resources"] for n in self.cluster_nodes()]
        except Exception:
            nodes = []
        res = pool_resource(gang.pool)
        total = sum(n.get(res, 0.0) for n in nodes)
        if total == 0:
            return (
                f"waiting for capacity: no alive Ray node carries {res}; the gang of {gang.world_size} "
                "starts when nodes with that resource join"
            )
        return (
            f"waiting for capacity: the gang of {gang.world_size} ranks does not fit pool {gang.pool} now "
            f"({total:g} {res} in the cluster, some in use); it starts only when all ranks fit"
        )

    def _create_actors(self, gang: _Gang) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cls = self._actor_class()
        bundles = gang.pg.bundle_specs
        for rk in gang.ranks:
            name = actor_name(gang.job_id, gang.attempt, rk.rank)
            with contextlib.suppress(ValueError):  # a leftover from a crashed control plane
                ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
            bundle = bundles[rk.rank]
            rk.actor = cls.options(
                name=name,
                namespace=self.namespace,
                lifetime="detached",
                max_restarts=0,
                max_task_retries=0,
                num_cpus=bundle.get("CPU", 0.0),
                num_gpus=bundle.get("GPU", 0.0),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=gang.pg, placement_group_bundle_index=rk.rank
                ),
            ).remote(gang.job_id, gang.attempt, rk.rank, self.orphan_timeout_s, self.sandbox)
        gang.hello_refs = [rk.actor.hello.remote(gang.probe_url, gang.probe_token) for rk in gang.ranks]
        gang.phase = "hello"
        gang.placed_s = time.time()

    def _advance_hello(self, gang: _Gang, out: list[ExecutorEvent]) -> None:
        import ray
        from ray.exceptions import RayActorError, RayError

        ready, _ = ray.wait(gang.hello_refs, num_returns=len(gang.hello_refs), timeout=0)
        if len(ready) < len(gang.hello_refs):
            # an actor that died before answering: its node is gone
            for rk, ref in zip(gang.ranks, gang.hello_refs, strict=True):
                if ref in ready:
                    try:
                        ray.get(ref, timeout=0)
                    except RayActorError as exc:
                        self._rank_lost(gang, rk, f"lost its Ray actor before starting ({_short(exc)})")
            if (
                gang.trigger is None
                and time.time() - (gang.placed_s or gang.launched_s) > self.startup_timeout_s
            ):
                self._set_trigger(
                    gang,
                    "lost",
                    {
                        "reason": f"the gang's actors did not start within {self.startup_timeout_s:.0f} s",
                        "rank": 0,
                    },
                    teardown_now=True,
                )
            if gang.trigger is not None:
                self._kill(gang)
            return
        hellos: list[dict[str, Any]] = []
        for rk, ref in zip(gang.ranks, gang.hello_refs, strict=True):
            try:
                rk.hello = ray.get(ref)
            except RayError as exc:
                self._rank_lost(gang, rk, f"lost its Ray actor before starting ({_short(exc)})")
                continue
            hellos.append(rk.hello)
        gang.hello_refs = []
        if gang.trigger is not None:
            self._kill(gang)
            return
        self._remove_probe(gang)
        refusal = _node_refusal(hellos, str(gang.doc.get("checkpoint_url")))
        if refusal is not None:
            self._set_trigger(gang, "failed", refusal, teardown_now=True)
            self._kill(gang)
            return
        env = dict(gang.doc.get("env") or {})
        if gang.world_size > 1:
            rank0 = gang.ranks[0].hello or {}
            env["MASTER_ADDR"] = str(rank0["node_ip"])
            env["MASTER_PORT"] = str(rank0["port"])
        gang.doc["env"] = env
        _write_json(gang.run_dir / launch_file_name(gang.attempt), gang.doc)
        for rk in gang.ranks:
            rk.start_ref = rk.actor.start.remote(gang.doc, env, self.python)
        gang.phase = "running"
        (gang.run_dir / f"workers-a{gang.attempt}.json").write_text(
            json.dumps([{"rank": rk.rank, **(rk.hello or {})} for rk in gang.ranks])
        )

    def _advance_start(self, gang: _Gang, rk: _Rank) -> None:
        import ray
        from ray.exceptions import RayError

        ready, _ = ray.wait([rk.start_ref], timeout=0)
        if not ready:
            return
        ref, rk.start_ref = rk.start_ref, None
        try:
            rk.pid = int(ray.get(ref))
        except RayError as exc:
            self._rank_lost(gang, rk, f"could not start its worker ({_short(exc)})")

    def _drain(self, gang: _Gang, rk: _Rank, now: float, out: list[ExecutorEvent]) -> None:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError, RayError

        if rk.drain_ref is None:
            rk.drain_ref = rk.actor.drain.remote(rk.event_offset, rk.log_offset, self.drain_wait_s)
            rk.drain_sent_s = now
            return
        ready, _ = ray.wait([rk.drain_ref], timeout=0)
        if not ready:
            if now - rk.drain_sent_s > self.heartbeat_timeout_s and gang.trigger is None:
                self._rank_lost(
                    gang,
                    rk,
                    f"got no answer from its Ray actor on {rk.host or 'its node'} for "
                    f"{now - rk.drain_sent_s:.0f} s",
                )
            return
        ref, rk.drain_ref = rk.drain_ref, None
        try:
            res = ray.get(ref)
        except ActorUnavailableError:
            return  # transient (the actor's node is reconnecting); retried on the next poll
        except RayActorError as exc:
            self._rank_lost(gang, rk, f"lost its Ray actor ({_short(exc)})")
            return
        except RayError as exc:
            log.warning("drain of job %s rank %s failed: %s", gang.job_id, rk.rank, _short(exc))
            return
        if res.get("pid") is not None:
            rk.pid = int(res["pid"])
        if res["log"]:
            with open(gang.run_dir / rank_log_name(rk.rank), "ab") as fh:
                fh.write(res["log"])
            rk.log_offset += len(res["log"])
        if res["events"]:
            with open(gang.run_dir / event_file_name(gang.attempt, rk.rank), "ab") as fh:
                fh.write(res["events"])
            rk.event_offset += len(res["events"])
            for raw in res["events"].splitlines():
                try:
                    doc = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(doc, dict) and "kind" in doc:
                    self._on_worker_event(gang, rk, doc, now, out)
        if res["exited"] and not res["events"] and not res["log"]:
            rk.exited, rk.exit_code = True, res.get("exit_code")
        else:
            rk.drain_ref = rk.actor.drain.remote(rk.event_offset, rk.log_offset, self.drain_wait_s)
            rk.drain_sent_s = now

    def _on_worker_event(
        self, gang: _Gang, rk: _Rank, doc: dict[str, Any], now: float, out: list[ExecutorEvent]
    ) -> None:
        t = float(doc.get("time_s", now))
        rk.last_seen_s = max(rk.last_seen_s or 0.0, t)
        kind = str(doc.get("kind"))
        data = dict(doc.get("data") or {})
        if kind in PASS_THROUGH_KINDS:
            if gang.adopted_at_s is not None and kind != "checkpoint" and t < gang.adopted_at_s:
                return
            if kind == "started" and rk.hello:
                data.setdefault("node_ip", rk.hello.get("node_ip"))
                data.setdefault("ray_node_id", rk.hello.get("node_id"))
            if kind == "started" and rk.pid and self.sandbox is not None:
                # a sandboxed worker sees its own pid namespace: the pid recorded (and adopted after a
                # control-plane restart) is the one on its node's host, bubblewrap's
                data = {**data, "pid": rk.pid, "pid_in_sandbox": data.get("pid")}
            out.append(ExecutorEvent(gang.job_id, gang.attempt, kind, data, t))
        elif kind in WORKER_TERMINAL_KINDS:
            rk.terminal = doc
            if kind == "failed":
                gang.failures.append({"rank": rk.rank, **data})
                if gang.trigger is None:
                    gang.trigger = ("failed", data)
                    gang.teardown_at_s = now + self.failure_grace_s

    # ---- failure detection and teardown ---------------------------------------------------------------
    def _rank_lost(self, gang: _Gang, rk: _Rank, how: str) -> None:
        rk.exited = True
        rk.actor_dead = True
        rk.drain_ref = None
        rk.start_ref = None
        if rk.terminal is None and not gang.killed and gang.preempt_deadline_s is None:
            rk.unreported = how
        self._set_trigger(
            gang, "lost", {"reason": f"rank {rk.rank} {how}", "rank": rk.rank}, teardown_now=True
        )

    def _set_trigger(self, gang: _Gang, kind: str, data: dict[str, Any], *, teardown_now: bool) -> None:
        if gang.trigger is None:
            gang.trigger = (kind, data)
            gang.teardown_at_s = time.time() if teardown_now else time.time() + self.failure_grace_s
        elif teardown_now:
            gang.teardown_at_s = min(gang.teardown_at_s or time.time(), time.time())

    def _observe(self, gang: _Gang, now: float) -> None:
        expected = gang.killed or gang.preempt_deadline_s is not None  # we killed it, or gave notice
        note_exits(gang.ranks, entrypoint=gang.entrypoint, expected=expected)
        if gang.trigger is None and gang.preempt_deadline_s is None and gang.phase == "running":
            trigger = first_abnormal(
                gang.ranks,
                now_s=now,
                entrypoint=gang.entrypoint,
                started_s=gang.placed_s or gang.launched_s,
                started_what="its placement",
                startup_timeout_s=self.startup_timeout_s,
                heartbeat_timeout_s=self.heartbeat_timeout_s,
                run_dir=gang.run_dir,
            )
            if trigger is not None:
                self._set_trigger(gang, *trigger, teardown_now=True)
        if gang.preempt_deadline_s is not None and now >= gang.preempt_deadline_s and not gang.killed:
            self._kill(gang)
        if gang.teardown_at_s is not None and now >= gang.teardown_at_s and not gang.killed:
            self._kill(gang)

    def _kill(self, gang: _Gang) -> None:
        """Tear the gang down: SIGKILL every worker through its actor (actors that do not confirm in
        time are killed themselves); ranks that never started count as gone at once."""
        gang.killed = True
        gang.kill_deadline_s = time.time() + 10.0
        for rk in gang.ranks:
            if rk.exited:
                continue
            if rk.actor is None or (rk.pid is None and rk.start_ref is None):
                self._kill_actor(rk)
                rk.exited = True
                continue
            rk.actor.kill_worker.remote()

    def _kill_actor(self, rk: _Rank) -> None:
        if rk.actor is None or rk.actor_dead:
            return
        import ray

        with contextlib.suppress(Exception):
            ray.kill(rk.actor, no_restart=True)
        rk.actor_dead = True

    def _release(self, gang: _Gang, live: list[_Rank]) -> None:
        """Ask live actors to remove their node-local files, then (on a later poll) kill them and
        remove the placement group."""
        refs = []
        actors = []
        for rk in live:
            with contextlib.suppress(Exception):
                refs.append(rk.actor.close.remote())
            actors.append(rk.actor)
        for rk in gang.ranks:
            if rk.actor is not None and rk.actor not in actors and not rk.actor_dead:
                actors.append(rk.actor)
        self._closing.append(_Closing(refs, actors, gang.pg, time.time() + 10.0))
        self._reap_closing()

    def _reap_closing(self, *, force: bool = False) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        keep = []
        for c in self._closing:
            if not force and c.refs and time.time() < c.deadline_s:
                ready, _ = ray.wait(c.refs, num_returns=len(c.refs), timeout=0)
                if len(ready) < len(c.refs):
                    keep.append(c)
                    continue
            if force and c.refs:
                with contextlib.suppress(Exception):
                    ray.wait(c.refs, num_returns=len(c.refs), timeout=max(0.0, c.deadline_s - time.time()))
            for actor in c.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            if c.pg is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(c.pg)
        self._closing = keep

    @staticmethod
    def _event(gang: _Gang, kind: str, data: dict[str, Any]) -> ExecutorEvent:
        return ExecutorEvent(gang.job_id, gang.attempt, kind, data, time.time())


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at a ``host:port`` (or ``ray://host:port``) address, or None when it does;
    other forms (``auto``) are left to Ray."""
    import socket

    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc.strerror or exc})"


#: A GCS method any client calls first; asked without a token, a cluster that requires one refuses it.
GCS_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"


def unauthenticated_cluster(address: str, timeout_s: float = 5.0) -> str | None:
    """Why the cluster at ``address`` does not require Ray's token authentication, or None when it does.

    This process must be in token mode (``RAY_AUTH_MODE=token``: it is how the driver sends the token),
    and the GCS must refuse a call that carries no token (``UNAUTHENTICATED``). A Ray Client address
    (``ray://``) is not probed: only the mode of this process is checked there."""
    if (os.environ.get("RAY_AUTH_MODE") or "").lower() != "token":
        return "this server does not run with RAY_AUTH_MODE=token"
    if "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    import grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary(
            GCS_PROBE_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            call(b"", timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return f"its GCS did not answer ({code.name})"
            return f"its GCS answered a call without a token with {code.name}"
    return "its GCS answers calls that carry no token"


#: where the head keeps the addresses of its autoscaler's and dashboard's metrics servers (GCS key-value)
EXPORTER_KV_KEYS = (b"AutoscalerMetricsAddress", b"DashboardMetricsAddress")


def metrics_exporter_addresses() -> list[str]:
    """``host:port`` of every Prometheus exporter the connected cluster advertises: each alive node's
    metrics export port (as the GCS records it) and the head's autoscaler and dashboard metrics
    servers (their addresses in the GCS's key-value store)."""
    import ray
    from ray.experimental import internal_kv

    out = {
        f"{n['NodeManagerAddress']}:{int(n['MetricsExportPort'])}"
        for n in ray.nodes()
        if n.get("Alive") and int(n.get("MetricsExportPort") or 0) > 0
    }
    for key in EXPORTER_KV_KEYS:
        with contextlib.suppress(Exception):
            value = internal_kv._internal_kv_get(key)
            if value:
                out.add(value.decode())
    return sorted(out)


def open_metrics_exporters(addresses: list[str], timeout_s: float = 2.0) -> list[str]:
    """Those of ``addresses`` (``host:port``) where ``GET /metrics`` without credentials is answered."""
    import urllib.request

    answered = []
    for where in addresses:
        try:
            with urllib.request.urlopen(f"http://{where}/metrics", timeout=timeout_s) as resp:
                if resp.status < 400:
                    answered.append(where)
        except Exception:  # refused, unreachable, an error status, no valid port (off), not HTTP
            continue
    return answered


def _node_refusal(hellos: list[dict[str, Any]], checkpoint_url: str) -> dict[str, Any] | None:
    """Why the gang's nodes must not start its workers (a ``failed`` event's data, infrastructure), or
    None: a node that does not read the checkpoint storage, or one where the sandbox cannot start."""
    for what, bad in (
        ("storage", [h for h in hellos if not h.get("storage_ok")]),
        ("sandbox", [h for h in hellos if h.get("sandbox_error")]),
    ):
        if not bad:
            continue
        ips = ", ".join(sorted({str(h.get("node_ip")) for h in bad}))
        if what == "storage":
            reason = (
                f"checkpoint storage {checkpoint_url} is not readable from Ray node(s) {ips}; every node "
                "must reach the same storage"
            )
        else:
            reason = (
                f"the sandbox cannot start on Ray node(s) {ips}: {bad[0]['sandbox_error']}; workers run "
                "only inside the sandbox (install bubblewrap on every node, docs/ray.md)"
            )
        return {
            "reason": reason,
            "classification": CLASSIFICATION_INFRA,
            "traceback_tail": "",
            "rank": int(bad[0]["rank"]),
        }
    return None


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _log_header(attempt: int, rank: int, note: str) -> bytes:
    return f"--- attempt {attempt} rank {rank} (Ray: {note}) ---\n".encode()


def _mirrored_log_bytes(path: Path, attempt: int, rank: int) -> int:
    """How many bytes of a rank's node-local log the control plane already copied after the header it
    wrote at launch (the offset to resume copying from after adoption)."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    marker = f"--- attempt {attempt} rank {rank} (Ray: ".encode()
    start = data.rfind(marker)
    if start < 0:
        return 0
    end = data.find(b"\n", start)
    return 0 if end < 0 else len(data) - (end + 1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
