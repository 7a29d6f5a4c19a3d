# WARNING: generated from handle_async.py by tools/async_to_sync.py.
# Do not edit: change handle_async.py, then run `python tools/async_to_sync.py`.
"""The :class:`JobHandle` ABC: one claim of one job (docs/contract.md §3 "Claim identity
and handle validity")."""

from __future__ import annotations

import abc
from datetime import datetime
from typing import TYPE_CHECKING, Any

from alkstore.contract.job import FAILED, MAX_ATTEMPTS_EXCEEDED, Job, JobState, _JobField
from alkstore.logic import validation as v
from alkstore.logic.backoff import backoff_delay_s
from alkstore.logic.codec import encode_result

if TYPE_CHECKING:
    from alkstore.contract.queue import Queue

__all__ = ["MAX_ATTEMPTS_EXCEEDED", "FAILED", "JobHandle"]


class JobHandle(abc.ABC):
    """One claim of one job, returned by :meth:`Queue.claim_one` and
    :meth:`Queue.claim_batch`; usable from any thread.

    An operation takes effect only while the job is processing, its claim has
    not lapsed (``now < claim_deadline``) and the claim is still this
    handle's (identified by the job id and its post-claim attempt count).
    A valid call on an invalid handle returns ``False`` and changes nothing;
    after ``ack``, ``retry``, ``fail`` or ``release`` took effect the handle
    is spent and every further operation returns ``False``. Every operation raises
    :class:`~alkstore.errors.StoreClosedError` once the store is closed,
    then :class:`~alkstore.errors.ValidationError` for bad arguments, whatever
    the handle's state.

    Every :class:`Job` field is readable on the handle too (``handle.id``,
    ``handle.payload`` ...), from the claim-time snapshot.

    Engine authors implement :meth:`_ack`, :meth:`_retry`,
    :meth:`_dead_letter`, :meth:`_heartbeat` and :meth:`_release`.
    """

    id = _JobField[int]()
    queue = _JobField[str]()
    state = _JobField[JobState]()
    payload = _JobField[Any]()
    payload_bytes = _JobField[bytes]()
    content_type = _JobField[str]()
    priority = _JobField[int]()
    run_at = _JobField[datetime]()
    expires_at = _JobField["datetime | None"]()
    enqueued_at = _JobField[datetime]()
    attempts = _JobField[int]()
    max_attempts = _JobField[int]()
    visibility_timeout_s = _JobField[float]()
    backoff_base_s = _JobField[int]()
    backoff_cap_s = _JobField[int]()
    worker_id = _JobField[str]()
    claim_deadline = _JobField[datetime]()
    last_error = _JobField["str | None"]()
    died_at = _JobField["datetime | None"]()
    unique_key = _JobField["str | None"]()

    def __init__(self, queue: Queue, job: Job) -> None:
        self._queue = queue
        self._job = job
        self._spent = False

    @property
    def job(self) -> Job:
        """The claim-time snapshot (not refreshed by later operations)."""
        return self._job

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} job {self._job.id} of {self._job.queue!r}, "
            f"attempt {self._job.attempts}>"
        )

    def _finish(self, took_effect: bool) -> bool:
        if took_effect:
            self._spent = True
        return took_effect

    def ack(self, result: object = None) -> bool:
        """The job is done: delete it, or, when the claiming queue handle
        keeps completed jobs (``QueueOpts.keep_completed_s``), keep it as
        ``"completed"`` with ``finished_at = now`` and ``result``
        (docs/contract.md §3 "Completed jobs").

        Parameters
        ----------
        result
            A strict-JSON value kept as ``Job.result``; ``None`` keeps none.
            Checked always, kept only by a queue that keeps completed jobs.

        Returns
        -------
        bool
            ``True`` if it took effect (see the class docstring).

        Raises
        ------
        ValidationError
            For a ``result`` the payload codec refuses, or ``bytes``.
        """
        self._queue.store._check_open()
        data = encode_result(result)
        if self._spent:
            return False
        if self._queue.opts.keep_completed_s is not None:
            return self._finish(self._complete(data))
        return self._finish(self._ack())

    def retry(self, error: str, delay: object = None) -> bool:
        """Put the job back to run again, or dead-letter it at its budget.

        Below the budget (``attempts < max_attempts``) the job returns to
        pending at ``now + delay`` (default: the backoff of docs/contract.md §3
        "Backoff" from the row's stamps), with ``last_error = error`` and
        ``attempts`` unchanged. At the budget it moves to the dead table with
        ``last_error = "max attempts exceeded"``.

        Parameters
        ----------
        error
            The error text (docs/contract.md §3 "Error text").
        delay
            Seconds or ``timedelta``, ``>= 0``.

        Returns
        -------
        bool
            ``True`` if it took effect.
        """
        self._queue.store._check_open()
        text = v.error_text(error)
        delay_s = None if delay is None else v.duration_s(delay, "delay")
        if self._spent:
            return False
        job = self._job
        if job.attempts >= job.max_attempts:
            return self._finish(self._dead_letter(MAX_ATTEMPTS_EXCEEDED))
        if delay_s is None:
            delay_s = backoff_delay_s(
                job.attempts, job.backoff_base_s, job.backoff_cap_s, self._queue.store.rng
            )
        return self._finish(self._retry(text, delay_s))

    def fail(self, error: str | None = None) -> bool:
        """Move the job to the dead table with ``last_error = error`` (or
        ``"failed"`` when ``None``).

        Returns
        -------
        bool
            ``True`` if it took effect.
        """
        self._queue.store._check_open()
        text = FAILED if error is None else v.error_text(error)
        if self._spent:
            return False
        return self._finish(self._dead_letter(text))

    def heartbeat(self, extend: object = None) -> bool:
        """Extend the claim: ``claim_deadline = now + extend`` (absolute, not
        added to the old deadline). Repeatable; refused once the claim has
        lapsed. The :attr:`job` snapshot is not refreshed.

        Parameters
        ----------
        extend
            Seconds or ``timedelta``, ``> 0``; default the row's
            ``visibility_timeout_s``.

        Returns
        -------
        bool
            ``True`` if it took effect.
        """
        self._queue.store._check_open()
        extend_s = (
            self._job.visibility_timeout_s
            if extend is None
            else v.duration_s(extend, "extend", positive=True)
        )
        if self._spent:
            return False
        return self._heartbeat(extend_s)

    def release(self) -> bool:
        """Give the claim back unused: the job was claimed but its handler
        never started (a worker's prefetched job at its stop).

        The job is due again at once for any worker, in its old place in
        the claim order (``run_at`` unchanged, no backoff), with
        ``worker_id`` and ``claim_deadline`` cleared and ``last_error``
        kept. The claim is not counted against the budget:
        ``max_attempts`` grows by one (up to ``2**31 - 1``) while
        ``attempts`` keeps its count, since claims only count up and no
        claim identity may repeat. The queue's subscribers are woken.
        docs/contract.md §3 "Release".

        Returns
        -------
        bool
            ``True`` if it took effect (see the class docstring); the
            handle is then spent.
        """
        self._queue.store._check_open()
        if self._spent:
            return False
        return self._finish(self._release())

    # -- engine primitives: each applies the validity predicate atomically --

    @abc.abstractmethod
    def _ack(self) -> bool:
        """Delete the row if this claim is valid."""

    @abc.abstractmethod
    def _complete(self, result: bytes | None) -> bool:
        """If valid: move the row to the completed rows in one atomic step,
        with ``finished_at = now`` and ``result`` (JSON bytes or ``None``)."""

    @abc.abstractmethod
    def _retry(self, error: str, delay_s: float) -> bool:
        """If valid: pending, ``run_at = now + delay_s``, ``last_error``,
        ``worker_id``/``claim_deadline`` cleared, attempts unchanged."""

    @abc.abstractmethod
    def _dead_letter(self, error: str) -> bool:
        """If valid: move the row to the dead table in one atomic step."""

    @abc.abstractmethod
    def _heartbeat(self, extend_s: float) -> bool:
        """If valid: ``claim_deadline = now + extend_s``."""

    @abc.abstractmethod
    def _release(self) -> bool:
        """If valid: pending (``scheduled`` when ``run_at > now``, for an
        engine that keeps such a state), ``run_at`` and ``attempts``
        unchanged, ``max_attempts = min(max_attempts + 1, 2**31 - 1)``,
        ``worker_id``/``claim_deadline`` cleared; wake the queue's
        subscribers once it committed."""
