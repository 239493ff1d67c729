"""The SDK for users' own training scripts (``entrypoint.command``).

```python
import trainyard.runtime as ty

session = ty.init()                                  # reads the launch, joins the gang, installs SIGTERM
state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
start = session.load(state) or 0                     # newest checkpoint that verifies, or None
for step in range(start, total):
    loss = train_one_step(...)
    session.report(step + 1, loss=loss)              # heartbeat (step time measured for you)
    if session.should_preempt():                     # every rank agrees after the same step
        session.save(step + 1, state, blocking=True)
        session.exit_preempted(step + 1)
    if session.checkpoint_due():
        session.save(step + 1, state)                # async; committed with a manifest
session.finish(model_path="out/model.safetensors")  # sha256 goes into the succeeded event
```

Outside trainyard (no ``TRAINYARD_RUN_DIR``), ``init()`` gives a single-process session writing to
``./.trainyard-run`` and ``./checkpoints`` so the same script runs on a laptop.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from trainyard.executors.base import (
    CLASSIFICATION_USER,
    EXIT_PREEMPTED,
    LaunchRequest,
)
from trainyard.runtime.checkpoint import CheckpointManager, CheckpointRef
from trainyard.runtime.events import EventWriter
from trainyard.runtime.trainer import PreemptionNotice, rss_gib

_SESSION: Session | None = None


class Session:
    def __init__(self, req: LaunchRequest, rank: int, run_dir: str, *, install_hooks: bool = True):
        self.req = req
        self.rank = rank
        self.world_size = req.world_size
        self.job_id = req.job_id
        self.attempt = req.attempt
        self.run_dir = run_dir
        self.events = EventWriter(run_dir, req.job_id, req.attempt, rank)
        self.notice = PreemptionNotice(req.notice_s, run_dir, req.attempt)
        self.pg = None
        ckpt_pg = None
        if self.world_size > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                from trainyard.runtime.worker import init_process_groups

                self.pg, ckpt_pg = init_process_groups(req, rank)
            else:
                self.pg, ckpt_pg = dist.group.WORLD, dist.new_group(backend="gloo")
        self.checkpoints = CheckpointManager(
            req.checkpoint_url,
            req.job_id,
            rank=rank,
            world_size=self.world_size,
            process_group=ckpt_pg,
            emit=self.events.emit,
            fallback_url=f"file://{Path(run_dir).resolve()}/checkpoints",
        )
        from trainyard.runtime.metrics import MetricsStream

        self.metrics = MetricsStream(
            self.events.emit,
            rank,
            every_steps=req.metrics_every_steps,
            max_rows_per_s=req.metrics_max_rows_per_s,
        )
        self.interval_s = req.checkpoint_interval_s
        self._last_report: tuple[float, int] | None = None
        self._last_ckpt_t = time.monotonic()
        self.resumed_from: int | None = None
        if install_hooks:
            self.notice.install()
            sys.excepthook = self._excepthook
        self.events.emit("started", rank=rank, pid=os.getpid(), host=os.uname().nodename, sdk=True)

    # ---- checkpoints ---------------------------------------------------------------------------
    def load(self, state: dict[str, Any]) -> int | None:
        """Load the newest verifying checkpoint into ``state`` (in place); returns its step or None."""
        ref = self.checkpoints.latest_valid() if self.rank == 0 else None
        if self.world_size > 1:
            import torch.distributed as dist

            box: list[Any] = [None if ref is None else (ref.step, ref.url, ref.manifest)]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            ref = None if box[0] is None else CheckpointRef(*box[0])
        if ref is None:
            return None
        self.checkpoints.load(ref, state)
        self.resumed_from = ref.step
        return ref.step

    def save(self, step: int, state: dict[str, Any], *, blocking: bool = False, **meta: Any) -> None:
        """Save ``state`` as ``step`` (async unless ``blocking``); ``meta`` goes into the manifest."""
        self.checkpoints.save(
            step, state, {"layout": {"format": "torch-dcp", "sdk": True}, **meta}, blocking=blocking
        )
        self._last_ckpt_t = time.monotonic()

    def checkpoint_due(self) -> bool:
        return self.interval_s is not None and time.monotonic() - self._last_ckpt_t >= self.interval_s

    # ---- signals -------------------------------------------------------------------------------
    def should_preempt(self, *, sync: bool = True) -> bool:
        """True once a preemption notice arrived; with ``sync``, on every rank after the same call."""
        flag = self.notice.pending
        if sync and self.world_size > 1:
            import torch
            import torch.distributed as dist

            t = torch.tensor([float(flag)])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.pg)
            flag = bool(t.item() > 0)
        return flag

    def notice_remaining_s(self) -> float:
        return self.notice.remaining_s()

    def report(
        self, step: int, *, loss: float | None = None, tokens: int | None = None, **metrics: Any
    ) -> None:
        """A heartbeat: progress, loss and the step time measured since the previous report."""
        now = time.perf_counter()
        step_time = None
        if self._last_report is not None and step > self._last_report[1]:
            step_time = (now - self._last_report[0]) / (step - self._last_report[1])
        self._last_report = (now, step)
        self.events.emit(
            "heartbeat",
            rank=self.rank,
            step=step,
            loss=loss,
            step_time_s=step_time,
            tokens_per_s=(tokens / step_time) if tokens and step_time else None,
            memory_gib=round(rss_gib(), 4),
            **metrics,
        )
        if self.rank == 0:  # step metrics at training resolution (GET /v1/jobs/{id}/metrics)
            row: dict[str, Any] = {
                k: v
                for k, v in metrics.items()
                if isinstance(v, int | float) and not isinstance(v, bool) and k != "final"
            }
            row.update(
                loss=loss,
                step_time_s=step_time,
                tokens_per_s=(tokens / step_time) if tokens and step_time else None,
            )
            self.metrics.record(step, **row)

    # ---- endings -------------------------------------------------------------------------------
    def exit_preempted(self, step: int) -> None:
        self.metrics.flush()
        self.checkpoints.close()
        committed = self.checkpoints.committed()
        self.events.emit(
            "preempted", rank=self.rank, step=step, checkpoint_step=committed[0].step if committed else None
        )
        self.events.close()
        os._exit(EXIT_PREEMPTED)

    def finish(self, *, model_path: str | None = None, final_step: int | None = None) -> None:
        """Report success; ``model_path`` (a local file) is hashed into the event."""
        self.metrics.flush()
        self.checkpoints.close()
        data: dict[str, Any] = {"rank": self.rank, "final_step": final_step}
        if model_path is not None and self.rank == 0:
            h = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
            data.update(model_path=str(Path(model_path).resolve()), model_sha256=h)
        self.events.emit("succeeded", **data)
        self.events.close()

    def _excepthook(self, typ: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        tail = "".join(traceback.format_exception(typ, exc, tb)[-30:])
        self.metrics.flush()
        self.events.emit(
            "failed",
            rank=self.rank,
            reason=f"{typ.__name__}: {exc}",
            classification=CLASSIFICATION_USER,
            traceback_tail=tail,
        )
        self.events.close()
        sys.__excepthook__(typ, exc, tb)


def init() -> Session:
    """The session of this process (created on the first call)."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    run_dir = os.environ.get("TRAINYARD_RUN_DIR")
    if run_dir:
        from trainyard.runtime.worker import read_launch

        attempt = int(os.environ.get("TRAINYARD_ATTEMPT", "0"))
        rank = int(os.environ.get("RANK", "0"))
        req = read_launch(run_dir, attempt)
    else:
        run_dir = str(Path(".trainyard-run").resolve())
        rank = 0
        req = LaunchRequest(
            job_id="local",
            attempt=0,
            spec={},
            world_size=1,
            pool="local",
            market="on_demand",
            checkpoint_url=f"file://{Path('checkpoints').resolve()}",
            checkpoint_interval_s=None,
            run_dir=run_dir,
        )
    _SESSION = Session(req, rank, run_dir)
    return _SESSION
