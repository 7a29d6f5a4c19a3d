"""A pure in-memory model of docs/contract.md §3: the executable reading of the contract.

The stateful test (:mod:`alkstore_contract_tests._stateful`) drives an engine
and this model with the same operations and compares every observable after
each step. The model is written from docs/contract.md alone, independently of the
core's shared helpers, so a disagreement points at the engine, the core or a
misreading of the contract -- never at a shared bug hiding itself.

Time is passed in explicitly (``now``), so the model does no I/O and never
reads a clock. Ids are allocated by the engine and handed to the model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from alkstore import QueueOpts, ValidationError

__all__ = [
    "EXPIRED",
    "FAILED",
    "MAX_ATTEMPTS_EXCEEDED",
    "MAX_ERROR_CHARS",
    "ModelHandle",
    "ModelJob",
    "ModelResolution",
    "ModelStore",
    "backoff_bounds",
    "stored_error_text",
]

MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"
FAILED = "failed"
EXPIRED = "expired"
MAX_ERROR_CHARS = 65_536

State = Literal["pending", "processing", "dead", "completed"]


def stored_error_text(error: str) -> str:
    """``last_error`` as docs/contract.md §3 "Error text" stores ``error``: its first
    65,536 characters, NUL replaced by U+FFFD."""
    return error[:MAX_ERROR_CHARS].replace("\x00", "\ufffd")


def backoff_bounds(attempt: int, base_s: int, cap_s: int) -> tuple[int, int]:
    """The inclusive range ``[ceil(exp/2), exp]`` of the retry delay after the
    ``attempt``-th claim (docs/contract.md §3 "Backoff"), ``exp = min(cap, base *
    2**(attempt-1))``. Written with plain integers, which do not overflow in
    Python; callers use it for moderate attempt counts."""
    exp = min(cap_s, base_s * 2 ** min(attempt - 1, 64))
    return math.ceil(exp / 2), exp


def _seconds(value: float | timedelta) -> timedelta:
    # Whole microseconds, seconds * 1e6 rounded half to even (D26).
    return value if isinstance(value, timedelta) else timedelta(microseconds=round(value * 1e6))


@dataclass
class ModelJob:
    """One job row as the model holds it; field names and meanings are
    :class:`alkstore.Job`'s (``payload`` is the decoded value)."""

    id: int
    queue: str
    state: State
    payload: Any
    priority: int
    run_at: datetime
    expires_at: datetime | None
    enqueued_at: datetime
    attempts: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: int
    backoff_cap_s: int
    worker_id: str | None = None
    claim_deadline: datetime | None = None
    last_error: str | None = None
    died_at: datetime | None = None
    unique_key: str | None = None
    finished_at: datetime | None = None
    result_bytes: bytes | None = None

    def expired(self, now: datetime) -> bool:
        """docs/contract.md §3 "Boundaries": ``expires_at`` set and ``now >= expires_at``."""
        return self.expires_at is not None and now >= self.expires_at

    def lapsed(self, now: datetime) -> bool:
        """docs/contract.md §3 "Boundaries": ``now >= claim_deadline``."""
        return self.claim_deadline is not None and now >= self.claim_deadline


@dataclass(frozen=True)
class ModelResolution:
    """The values one enqueue call stamps on its rows (docs/contract.md §3 "Option
    resolution")."""

    enqueued_at: datetime
    run_at: datetime
    expires_at: datetime | None
    priority: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: int
    backoff_cap_s: int


@dataclass
class ModelHandle:
    """One claim: the job id, its post-claim attempt count (the claim's
    identity) and the claim-time snapshot."""

    job_id: int
    attempts: int
    snapshot: ModelJob
    spent: bool = False


@dataclass
class ModelStore:
    """Every queue of one store: live rows and dead rows, keyed by id."""

    live: dict[int, ModelJob] = field(default_factory=dict)
    dead: dict[int, ModelJob] = field(default_factory=dict)
    completed: dict[int, ModelJob] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    # -- enqueue ---------------------------------------------------------------

    @staticmethod
    def resolve(
        now: datetime,
        opts: QueueOpts,
        *,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: float | timedelta | None = None,
    ) -> ModelResolution:
        """Resolve one enqueue call (one clock reading, ``now``).

        Raises
        ------
        ValidationError
            If the resolved ``expires_at`` is at or before ``run_at``.
        """
        if delay is not None:
            due = now + _seconds(delay)
        elif run_at is not None:
            due = run_at
        else:
            due = now
        expires_s: float | timedelta | None = expires if expires is not None else opts.expires_s
        expires_at = None if expires_s is None else now + _seconds(expires_s)
        if expires_at is not None and expires_at <= due:
            raise ValidationError("expires_at at or before run_at")
        return ModelResolution(
            enqueued_at=now,
            run_at=due,
            expires_at=expires_at,
            priority=opts.priority if priority is None else priority,
            max_attempts=opts.max_attempts if max_attempts is None else max_attempts,
            visibility_timeout_s=opts.visibility_timeout_s,
            backoff_base_s=opts.backoff_base_s,
            backoff_cap_s=opts.backoff_cap_s,
        )

    def holder(self, queue: str, unique_key: str) -> int | None:
        """The id of the live row of ``queue`` that holds ``unique_key``
        (docs/contract.md §3 "Unique keys"), or ``None``."""
        for row in self.live.values():
            if row.queue == queue and row.unique_key == unique_key:
                return row.id
        return None

    def insert(
        self,
        queue: str,
        ids: Iterable[int],
        payloads: Iterable[Any],
        res: ModelResolution,
        unique_keys: Iterable[str | None] | None = None,
    ) -> list[int]:
        """Add one pending row per (id, payload), all sharing ``res``, in
        order; return each item's job id. An item whose unique key a live
        row of ``queue`` holds (an earlier item's included) adds nothing and
        gets that row's id; its own id (which may be that one) is unused."""
        items = list(zip(ids, payloads, strict=True))
        keys = [None] * len(items) if unique_keys is None else list(unique_keys)
        result = []
        for (job_id, payload), key in zip(items, keys, strict=True):
            held = None if key is None else self.holder(queue, key)
            if held is not None:
                result.append(held)
                continue
            if job_id in self.live or job_id in self.dead or job_id in self.completed:
                raise AssertionError(f"id {job_id} reused")
            result.append(job_id)
            self.live[job_id] = ModelJob(
                id=job_id,
                queue=queue,
                state="pending",
                payload=copy.deepcopy(payload),
                priority=res.priority,
                run_at=res.run_at,
                expires_at=res.expires_at,
                enqueued_at=res.enqueued_at,
                attempts=0,
                max_attempts=res.max_attempts,
                visibility_timeout_s=res.visibility_timeout_s,
                backoff_base_s=res.backoff_base_s,
                backoff_cap_s=res.backoff_cap_s,
                unique_key=key,
            )
        return result

    # -- reads -----------------------------------------------------------------

    def get_job(self, queue: str, job_id: int) -> ModelJob | None:
        """A copy of the live, dead or completed row ``job_id`` of ``queue``,
        or ``None``."""
        row = self.live.get(job_id) or self.dead.get(job_id) or self.completed.get(job_id)
        if row is None or row.queue != queue:
            return None
        return replace(row)

    def ids(self, queue: str) -> list[int]:
        """Every live, dead and completed id of ``queue``, ascending."""
        rows = [*self.live.values(), *self.dead.values(), *self.completed.values()]
        return sorted(r.id for r in rows if r.queue == queue)

    def stats(self, queue: str, now: datetime) -> tuple[int, int, int, int]:
        """``(pending, scheduled, processing, dead)`` (docs/contract.md §3 "stats()")."""
        live = [r for r in self.live.values() if r.queue == queue]
        return (
            sum(r.state == "pending" and r.run_at <= now for r in live),
            sum(r.state == "pending" and r.run_at > now for r in live),
            sum(r.state == "processing" for r in live),
            sum(r.queue == queue for r in self.dead.values()),
        )

    def lapsed_claims(self, queue: str, now: datetime) -> int:
        """Processing rows whose claim has lapsed (docs/contract.md §3 "Boundaries")."""
        return sum(
            r.queue == queue and r.state == "processing" and r.lapsed(now)
            for r in self.live.values()
        )

    # -- claim -----------------------------------------------------------------

    def _move_to_dead(self, row: ModelJob, error: str, now: datetime) -> None:
        del self.live[row.id]
        row.state = "dead"
        row.last_error = error
        row.died_at = now
        self.dead[row.id] = row

    def claim(self, queue: str, worker_id: str, n: int, now: datetime) -> list[ModelHandle]:
        """Claim up to ``n`` rows (docs/contract.md §3 "Claim"); ``n <= 0`` or a paused
        queue does nothing (no reclaim, no dead-lettering)."""
        if n <= 0 or queue in self.paused:
            return []
        for row in list(self.live.values()):
            if (
                row.queue == queue
                and row.state == "processing"
                and row.lapsed(now)
                and row.attempts >= row.max_attempts
            ):
                self._move_to_dead(row, MAX_ATTEMPTS_EXCEEDED, now)
        eligible = [
            row
            for row in self.live.values()
            if row.queue == queue
            and not row.expired(now)
            and (
                (row.state == "pending" and row.run_at <= now)
                or (
                    row.state == "processing"
                    and row.lapsed(now)
                    and row.attempts < row.max_attempts
                )
            )
        ]
        eligible.sort(key=lambda r: (-r.priority, r.run_at, r.id))
        handles = []
        for row in eligible[:n]:
            row.state = "processing"
            row.attempts += 1
            row.worker_id = worker_id
            row.claim_deadline = now + _seconds(row.visibility_timeout_s)
            handles.append(ModelHandle(row.id, row.attempts, replace(row)))
        return handles

    # -- handle operations -----------------------------------------------------

    def valid_row(self, handle: ModelHandle, now: datetime) -> ModelJob | None:
        """The row if ``handle``'s claim is valid (docs/contract.md §3 "Claim identity and
        handle validity"), else ``None``."""
        row = self.live.get(handle.job_id)
        if (
            handle.spent
            or row is None
            or row.state != "processing"
            or row.attempts != handle.attempts
            or row.lapsed(now)
        ):
            return None
        return row

    def ack(
        self, handle: ModelHandle, now: datetime, keep: bool = False, result: bytes | None = None
    ) -> bool:
        """``JobHandle.ack``: if the claim is valid, delete the row, or with
        ``keep`` (the acking handle keeps completed jobs) move it to the
        completed rows with ``finished_at = now`` and ``result``."""
        row = self.valid_row(handle, now)
        if row is None:
            return False
        self._finish_row(row, now, keep, result)
        handle.spent = True
        return True

    def _finish_row(self, row: ModelJob, now: datetime, keep: bool, result: bytes | None) -> None:
        del self.live[row.id]
        if keep:
            row.state = "completed"
            row.finished_at = now
            row.result_bytes = result
            self.completed[row.id] = row

    def retry(
        self,
        handle: ModelHandle,
        error: str,
        now: datetime,
        delay: float | timedelta | None = None,
        *,
        draw: Callable[[int, int], int] | None = None,
    ) -> bool:
        """``JobHandle.retry``. Without ``delay`` the backoff is
        ``draw(low, high)`` over :func:`backoff_bounds` of the row's stamps
        (``draw`` plays the store's ``rng.randint``; 0 when the ceiling is 0).
        """
        row = self.valid_row(handle, now)
        if row is None:
            return False
        handle.spent = True
        if row.attempts >= row.max_attempts:
            self._move_to_dead(row, MAX_ATTEMPTS_EXCEEDED, now)
            return True
        if delay is None:
            low, high = backoff_bounds(row.attempts, row.backoff_base_s, row.backoff_cap_s)
            if high == 0:
                delay = 0
            else:
                if draw is None:
                    raise TypeError("retry without delay needs draw")
                delay = draw(low, high)
        row.state = "pending"
        row.run_at = now + _seconds(delay)
        row.last_error = stored_error_text(error)
        row.worker_id = None
        row.claim_deadline = None
        return True

    def fail(self, handle: ModelHandle, error: str | None, now: datetime) -> bool:
        """``JobHandle.fail``: to the dead table, ``last_error`` the error or
        ``"failed"``."""
        row = self.valid_row(handle, now)
        if row is None:
            return False
        handle.spent = True
        self._move_to_dead(row, FAILED if error is None else stored_error_text(error), now)
        return True

    def heartbeat(
        self, handle: ModelHandle, extend: float | timedelta | None, now: datetime
    ) -> bool:
        """``JobHandle.heartbeat``: ``claim_deadline = now + extend`` (default
        the row's visibility timeout); absolute, not additive."""
        row = self.valid_row(handle, now)
        if row is None:
            return False
        row.claim_deadline = now + _seconds(row.visibility_timeout_s if extend is None else extend)
        return True

    def release(self, handle: ModelHandle, now: datetime) -> bool:
        """``JobHandle.release``: the claim given back unused; due again in
        its old place, ``attempts`` kept, the budget one larger."""
        row = self.valid_row(handle, now)
        if row is None:
            return False
        handle.spent = True
        row.state = "pending"
        row.worker_id = None
        row.claim_deadline = None
        row.max_attempts = min(row.max_attempts + 1, 2**31 - 1)
        return True

    # -- queue operations ------------------------------------------------------

    def ack_batch(
        self, queue: str, job_ids: Iterable[int], now: datetime, keep: bool = False
    ) -> int:
        """``Queue.ack_batch``: per distinct id, the validity predicate without
        the claim identity (processing, not lapsed), no worker filter; with
        ``keep``, the rows are completed (no result)."""
        count = 0
        for job_id in dict.fromkeys(job_ids):
            row = self.live.get(job_id)
            if (
                row is not None
                and row.queue == queue
                and row.state == "processing"
                and not row.lapsed(now)
            ):
                self._finish_row(row, now, keep, None)
                count += 1
        return count

    def cancel(self, queue: str, job_id: int) -> bool:
        """``Queue.cancel``: delete a live row of ``queue``."""
        row = self.live.get(job_id)
        if row is None or row.queue != queue:
            return False
        del self.live[job_id]
        return True

    def sweep_expired(
        self,
        queue: str,
        retention_s: float | None,
        now: datetime,
        keep_completed_s: float | None = None,
    ) -> tuple[int, int]:
        """``Queue.sweep_expired``: ``(expired, purged)``; purged counts dead
        rows past ``retention_s`` and completed rows that finished
        ``keep_completed_s`` ago or more."""
        expired = 0
        for row in list(self.live.values()):
            if row.queue == queue and row.expired(now):
                self._move_to_dead(row, EXPIRED, now)
                expired += 1
        purged = 0
        if retention_s is not None:
            for row in list(self.dead.values()):
                assert row.died_at is not None
                if row.queue == queue and row.died_at + _seconds(retention_s) <= now:
                    del self.dead[row.id]
                    purged += 1
        if keep_completed_s is not None:
            for row in list(self.completed.values()):
                assert row.finished_at is not None
                if row.queue == queue and row.finished_at + _seconds(keep_completed_s) <= now:
                    del self.completed[row.id]
                    purged += 1
        return expired, purged

    # -- operations (pause, dead letters) --------------------------------------

    def queue_names(self) -> list[str]:
        """``Store.queue_names``: queues with live, dead or completed rows, or
        paused."""
        rows = [*self.live.values(), *self.dead.values(), *self.completed.values()]
        return sorted({r.queue for r in rows} | self.paused)

    def set_paused(self, queue: str, paused: bool) -> bool:
        """``Queue.pause`` (``paused``) or ``Queue.resume``: ``True`` on a
        change."""
        if (queue in self.paused) == paused:
            return False
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)
        return True

    def dead_jobs(self, queue: str, limit: int, after_id: int | None) -> list[ModelJob]:
        """``Queue.dead_jobs``: copies of up to ``limit`` dead rows of
        ``queue`` with ids above ``after_id``, by id."""
        rows = sorted(
            (
                r
                for r in self.dead.values()
                if r.queue == queue and (after_id is None or r.id > after_id)
            ),
            key=lambda r: r.id,
        )
        return [replace(r) for r in rows[:limit]]

    def jobs(
        self, queue: str, state: str, limit: int, after_id: int | None, now: datetime
    ) -> list[ModelJob]:
        """``Queue.jobs``: copies of up to ``limit`` rows of ``queue`` in the
        listing ``state`` with ids above ``after_id``, by id; ``"pending"``
        and ``"scheduled"`` split the pending rows at ``run_at <= now``."""
        table = {"dead": self.dead, "completed": self.completed}.get(state, self.live)

        def listed(row: ModelJob) -> bool:
            if state == "pending":
                return row.state == "pending" and row.run_at <= now
            if state == "scheduled":
                return row.state == "pending" and row.run_at > now
            return row.state == state

        rows = sorted(
            (
                r
                for r in table.values()
                if r.queue == queue and (after_id is None or r.id > after_id) and listed(r)
            ),
            key=lambda r: r.id,
        )
        return [replace(r) for r in rows[:limit]]

    def requeue(self, queue: str, job_id: int, run_at: datetime) -> bool:
        """``Queue.requeue`` with the resolved ``run_at``: the dead row back to
        pending, its attempts kept and its budget renewed (``max_attempts``
        raised by the attempts it used, at most ``2**31 - 1``), its expiry duration
        (``expires_at - enqueued_at``) counted again from ``run_at``, claim
        fields and ``died_at`` cleared, ``last_error`` kept; ``False`` for a
        row whose unique key a live row holds."""
        row = self.dead.get(job_id)
        if row is None or row.queue != queue:
            return False
        if row.unique_key is not None and self.holder(queue, row.unique_key) is not None:
            return False  # a live job holds its key: it stays dead
        del self.dead[job_id]
        if row.expires_at is not None:
            row.expires_at = run_at + (row.expires_at - row.enqueued_at)
        row.state = "pending"
        row.run_at = run_at
        row.max_attempts = min(row.attempts + row.max_attempts, 2**31 - 1)
        row.worker_id = None
        row.claim_deadline = None
        row.died_at = None
        self.live[job_id] = row
        return True

    def run_now(self, queue: str, job_id: int, now: datetime) -> bool:
        """``Queue.run_now``: a pending row of ``queue`` not due yet and not
        expired gets ``run_at = now``; whether one did."""
        row = self.live.get(job_id)
        if (
            row is None
            or row.queue != queue
            or row.state != "pending"
            or row.run_at <= now
            or row.expired(now)
        ):
            return False
        row.run_at = now
        return True

    def purge_dead(self, queue: str, older_than: float | timedelta | None, now: datetime) -> int:
        """``Queue.purge_dead``: delete the dead rows of ``queue`` with
        ``died_at + older_than <= now`` (all with ``None``); the count."""
        purged = 0
        for row in list(self.dead.values()):
            assert row.died_at is not None
            if row.queue == queue and (
                older_than is None or row.died_at + _seconds(older_than) <= now
            ):
                del self.dead[row.id]
                purged += 1
        return purged
