"""Concurrent admissions against one budget period, reserved together.

Every admission of a budget updates that budget's period row, so on PostgreSQL concurrent admissions
of one tenant queue on the row's lock, each behind the previous one's commit (on SQLite, on the one
writers' lock, each with a commit of its own). :class:`BatchedAdmissions`
lets them share the trip: the first admission of a period to arrive leads, and takes with it every
admission of that period that arrived while the previous batch was in the database; the batch is one
transaction — one conditional UPDATE for the batch's total (``spent + reserved + total <= limit``, the
limit and the number of hard budgets read inside the statement, as :func:`ledger.reserve_one` does),
then the reservation rows, the jobs and their first events. A batch whose total does not fit, or that
fails (an Idempotency-Key already used, say), writes nothing, and each of its admissions is then
decided on its own, the way a single admission is: so a batch never admits anything that the
admissions one at a time would not, and the bound stays 0 overshoot. A batch of one is the single
statement of :func:`ledger.reserve_one_and_insert_job` (on SQLite the one short transaction of
:func:`ledger.reserve_one` and the job), so an admission that meets no other pays nothing for this.

On SQLite a batch of one is four statements (the UPDATE, the reservation row, the job, its event)
against an ungoverned submission's two, while a batch of any size is those same four; so there an
admission that finds itself alone first lets the other threads run once (``time.sleep(0)`` gives up
the GIL) and then takes everything that queued meanwhile: the submissions being handled at the same
time (parsed, validated, quoted) reach the queue and share its statements and commit instead of each
leading a batch of one. Measured in ``trainyard up`` with 8 clients, batches of one went from 32-56 %
of governed admissions to 2-4 % (docs/benchmarks.md, "Cost governance"). On PostgreSQL a batch of one
is already one statement, like an ungoverned submission, and does not wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from trainyard.store.db import Database
from trainyard.store.repositories import insert_job, insert_jobs
from trainyard.tenancy import ledger

ALONE = object()  # the admission has to be decided on its own (its batch wrote nothing)
REFUSED = object()  # decided on its own already: the statement refused it (the full path explains why)


@dataclass
class _Admission:
    job: Any
    first_event: tuple[str, dict[str, Any], float]
    amount_usd: float
    now_s: float
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to lead the next batch rather than with a result
    result: Any = None  # the new job's sequence, or ALONE


def _yield_gil() -> None:
    time.sleep(0)


class BatchedAdmissions:
    def __init__(
        self, db: Database, max_batch: int = 64, alone_pause: Callable[[], None] | None = None
    ) -> None:
        self.db = db
        self._max = max_batch
        # run by an admission that finds no other of its period queued, before it takes its batch (see
        # the module's docstring); SQLite only unless given
        self._alone_pause = alone_pause or (_yield_gil if db.dialect == "sqlite" else None)
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str], list[_Admission]] = {}
        self._leading: set[tuple[str, str]] = set()
        self.batches = 0  # transactions run (for tests and metrics)

    @property
    def queued(self) -> int:
        """Admissions waiting for a batch, or in one that is being written (for tests and metrics)."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def admit(
        self,
        *,
        budget: ledger.Budget,
        n_hard: int,
        job: Any,
        first_event: tuple[str, dict[str, Any], float],
        amount_usd: float,
        now_s: float,
    ) -> Any:
        """The job's sequence once reserved and inserted; :data:`REFUSED` when its statement, alone,
        changed nothing; :data:`ALONE` when its batch wrote nothing and the caller has to try it by
        itself."""
        key = (budget.id, ledger.period_key(budget.period, now_s))
        me = _Admission(job, first_event, max(0.0, float(amount_usd)), now_s)
        with self._lock:
            queue = self._queues.setdefault(key, [])
            queue.append(me)
            alone = len(queue) == 1
            lead = key not in self._leading
            if lead:
                self._leading.add(key)
        if not lead:
            me.done.wait()
            if not me.lead:
                return me.result
        elif alone and self._alone_pause is not None:
            self._alone_pause()  # admissions arriving meanwhile queue behind this one and join its batch
        # lead one batch (which holds this admission), then hand the lead to the next one waiting
        with self._lock:
            queue = self._queues.get(key, [])
            batch, rest = queue[: self._max], queue[self._max :]
            if rest:
                self._queues[key] = rest
            else:
                self._queues.pop(key, None)
        try:
            self._run(budget, n_hard, key[1], batch)
        finally:
            for a in batch:
                if a.result is None:
                    a.result = ALONE
            with self._lock:
                nxt = self._queues.get(key)
                if nxt:
                    nxt[0].lead = True
                    nxt[0].done.set()
                else:
                    self._leading.discard(key)
            for a in batch:
                if a is not me:
                    a.done.set()
        return me.result

    def _run(self, budget: ledger.Budget, n_hard: int, pk: str, batch: list[_Admission]) -> None:
        self.batches += 1
        seqs: list[Any] | None = None
        try:
            if len(batch) == 1:
                a = batch[0]
                a.result = self._one(budget, n_hard, a)
                return
            elif self.db.dialect == "postgresql":  # one statement, in autocommit
                with self.db.write_connection(single_statement=True) as conn:
                    seqs = ledger.reserve_and_insert_jobs(
                        conn,
                        budget=budget,
                        n_hard=n_hard,
                        period=pk,
                        batch=[(a.job, a.first_event, a.amount_usd) for a in batch],
                    )
            else:
                with self.db.write_connection() as conn:
                    seqs = self._write(conn, budget, n_hard, pk, batch)
        except Exception:
            seqs = None  # rolled back: each admission is decided on its own
        for a, seq in zip(batch, seqs or [ALONE] * len(batch), strict=True):
            a.result = seq

    def admit_alone(
        self,
        *,
        budget: ledger.Budget,
        n_hard: int,
        job: Any,
        first_event: tuple[str, dict[str, Any], float],
        amount_usd: float,
        now_s: float,
    ) -> Any:
        """One admission decided on its own (after :meth:`admit` answered :data:`ALONE`): the job's
        sequence, or :data:`REFUSED` (nothing written)."""
        return self._one(budget, n_hard, _Admission(job, first_event, amount_usd, now_s))

    def _one(self, budget: ledger.Budget, n_hard: int, a: _Admission) -> Any:
        """A batch of one: the job's sequence, or REFUSED (nothing written)."""
        if self.db.dialect == "postgresql":
            with self.db.write_connection(single_statement=True) as conn:
                seq = ledger.reserve_one_and_insert_job(
                    conn,
                    budget=budget,
                    n_hard=n_hard,
                    job=a.job,
                    first_event=a.first_event,
                    amount_usd=a.amount_usd,
                    now_s=a.now_s,
                )
            return REFUSED if seq is None else seq
        with self.db.write_connection() as conn:  # SQLite: a transaction queued on the writers' lock
            if not ledger.reserve_one(
                conn, budget=budget, n_hard=n_hard, job_id=a.job.id, amount_usd=a.amount_usd, now_s=a.now_s
            ):
                return REFUSED
            return insert_job(conn, a.job, a.first_event).seq

    @staticmethod
    def _write(
        conn: Connection, budget: ledger.Budget, n_hard: int, pk: str, batch: list[_Admission]
    ) -> list[Any] | None:
        total = sum(a.amount_usd for a in batch)
        params = {
            "b_id": budget.id,
            "b_pk": pk,
            "amount": total,
            "tenant_id": budget.tenant_id,
            "n_hard": n_hard,
        }
        if not conn.execute(ledger._RESERVE_ONE, params).rowcount:
            return None
        conn.execute(
            ledger._INSERT_RESERVATION,
            [
                {"job_id": a.job.id, "budget_id": budget.id, "period_key": pk, "remaining_usd": a.amount_usd}
                for a in batch
            ],
        )
        return insert_jobs(conn, [(a.job, a.first_event) for a in batch])
