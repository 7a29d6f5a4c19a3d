"""Schedule specs: when a cron-style schedule has its boundaries.

A *boundary* is an instant at which the scheduler enqueues a job.  Three
spellings are accepted (see :func:`parse_schedule`):

* a 5-field cron expression, ``"minute hour day-of-month month day-of-week"``
  (``"30 2 * * *"``, ``"*/15 9-17 * * MON-FRI"``, ``"0 0 L * *"``,
  ``"0 9 * * MON#1"``), parsed and matched by `cronsim
  <https://github.com/cuu508/cronsim>`_ (Healthchecks' evaluator, which
  follows Debian cron) against wall-clock times in the schedule's IANA zone;
* an alias: ``@yearly`` (= ``@annually``), ``@monthly``, ``@weekly``,
  ``@daily`` (= ``@midnight``), ``@hourly``, mapped here to the 5-field
  expressions Debian cron gives them (``crontab(5)``);
* ``@every <duration>``, Go-style (``30s``, ``5m``, ``1h30m``, ``2d``):
  the instants ``1970-01-01T00:00:00Z + k * duration`` for every integer
  ``k``, whatever the time zone.

Daylight-saving changes follow Debian cron (``cron(8)``), as cronsim means
to.  Debian cron sorts jobs into two kinds by the first character of the
minute and hour fields:

* *fixed-time* jobs (neither field starts with ``*``, e.g. ``30 2 * * *``,
  ``0,15,30,45 2 * * *``, ``@daily``): wall times skipped by a spring-forward
  change fire once, at the first instant after the gap (in America/New_York,
  ``30 2 * * *`` on 2025-03-09 fires at 03:00 EDT, 07:00Z); a wall time that
  occurs twice at a fall-back change fires once, at its first occurrence
  (``30 1 * * *`` on 2025-11-02 fires at 01:30 EDT, 05:30Z, not again at
  01:30 EST);
* *wildcard* jobs (the minute or the hour field starts with ``*``, e.g.
  ``0 * * * *``, ``*/15 2 * * *``, ``@hourly``) follow the wall clock as it
  is: wall times in a gap never happen, so they do not fire, and wall times
  that occur twice fire twice (``0 * * * *`` fires every real hour, 23 times
  on a spring-forward day and 25 on a fall-back day).

cronsim applies these rules itself when given a zone-aware start, but not
always correctly: from inside the repeated hour of a fall-back change its
forward iteration can return an instant before the start and its reverse
iteration skips boundaries of that hour, and for wildcard jobs in a zone
whose change is not a whole hour (Australia/Lord_Howe) it skips wall times
after the change.  So this module uses cronsim only on naive wall-clock
times (parsing and calendar matching, where no DST is involved), forwards
and in reverse, and maps wall times to instants itself with the rules above,
walking the zone's UTC-offset changes.  It assumes a zone's offset does not
change twice within :data:`_OFFSET_STEP` (true of every zone in the tz
database since 1970: the closest changes are about 7 days apart).

Both methods derive from one definition of the boundary set, so for every
instant ``t``: ``next_after(t) > t``, ``latest_at_or_before(t) <= t <
next_after(latest_at_or_before(t))`` and ``latest_at_or_before(next_after(t))
== next_after(t)``.

Pure code: no database, no clock.  Instants in are timezone-aware datetimes
(any zone; naive ones are not supported and may raise ``TypeError`` or
``ValueError``); instants out are aware in :data:`datetime.UTC`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim

from alkstore.errors import ValidationError

__all__ = ["ScheduleSpec", "parse_schedule"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US_PER_S = 1_000_000
_ONE_US = timedelta(microseconds=1)
_ONE_MINUTE = timedelta(minutes=1)

# The aliases of Debian cron's crontab(5), as 5-field expressions.  cronsim
# itself takes no aliases.  @hourly has a star in its hour field, so like
# Debian's (which sets HR_STAR for it) it is a wildcard job.
_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_EVERY = re.compile(r"@every(?:\s+(?P<duration>.*))?", re.IGNORECASE | re.DOTALL)
_DURATION = re.compile(r"(?:[0-9]+[dhms])+")
_DURATION_PART = re.compile(r"([0-9]+)([dhms])")
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
# 100 years of 365.25 days.
_MAX_EVERY_S = 36_525 * 86_400
_MAX_DURATION_DIGITS = 12

# IANA names are relative paths of letters, digits, '_', '-' and '+'; this
# refuses '', absolute paths, '.', '..' and backslashes before zoneinfo sees
# them.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
# Files in the zone database that are no IANA zone: 'localtime' is the
# machine's own setting, so a schedule naming it would differ per machine.
_NOT_ZONES = frozenset({"localtime", "posixrules"})

# A spec must fire within cronsim's 50-year search from this wall time.
# Every cron expression that fires at all does: the sparsest (a Feb 29 on a
# given weekday) fires at least every 40 years.
_PROBE = datetime(2000, 1, 1)
# The offset is sampled this often between a start and a candidate boundary
# to find the zone's changes in between; two changes closer than this would
# be missed (see the module docstring).
_OFFSET_STEP = timedelta(days=2)
# More than any zone's offsets differ by (-12:00 to +14:00).
_NEAR_CHANGE = timedelta(hours=27)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule: its text, its time zone and its boundaries.

    Build one with :func:`parse_schedule` (calling the class validates the
    same way).  Equality and hashing use ``spec`` and ``timezone`` only.

    Attributes
    ----------
    spec
        The schedule text as given, stripped of surrounding whitespace, e.g.
        ``"30 2 * * *"``, ``"@daily"``, ``"@every 30s"``.
    timezone
        The IANA zone name cron fields are read in, e.g. ``"UTC"``,
        ``"America/New_York"``.  ``@every`` schedules ignore it.

    Raises
    ------
    alkstore.errors.ValidationError
        On construction, for anything :func:`parse_schedule` refuses.
    """

    spec: str
    timezone: str
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    # The 5-field expression given to cronsim, or None for @every.
    _cron: str | None = field(init=False, repr=False, compare=False)
    # Debian cron's wildcard kind (minute or hour field starts with '*').
    _wildcard: bool = field(init=False, repr=False, compare=False)
    # The @every period in microseconds, or None for cron.
    _every_us: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = _check_str(self.spec, "schedule spec").strip()
        zone = _load_zone(_check_str(self.timezone, "time zone"))
        cron, every_us = _compile_spec(spec)
        fields = cron.split() if cron is not None else []
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_cron", cron)
        object.__setattr__(self, "_wildcard", any(f.startswith("*") for f in fields[:2]))
        object.__setattr__(self, "_every_us", every_us)

    def next_after(self, instant: datetime) -> datetime:
        """Return the first boundary strictly after ``instant``.

        Parameters
        ----------
        instant
            A timezone-aware datetime, any zone (naive is not supported).

        Returns
        -------
        datetime
            Aware, in :data:`datetime.UTC`, ``> instant``: for cron a whole
            minute (or, for a fixed-time job whose wall time falls in a
            spring-forward gap, the instant the gap ends), DST handled as
            Debian cron does (see the module docstring); for ``@every``,
            ``epoch + k * period``.  Feeding each result back in gives every
            boundary once, in strictly increasing order.

        Raises
        ------
        alkstore.errors.ValidationError
            If a cron schedule has no boundary within cronsim's 50-year
            search after ``instant`` (not seen for a spec that
            :func:`parse_schedule` accepted).
        OverflowError
            If the boundary would be after year 9999.
        """
        t = instant.astimezone(UTC)
        if self._every_us is not None:
            k = _us_since_epoch(t) // self._every_us + 1
            return _EPOCH + timedelta(microseconds=k * self._every_us)
        found = next(self._boundaries_after(t), None)
        if found is None:
            raise ValidationError(
                f"schedule {self.spec!r} has no boundary within 50 years after {t.isoformat()}"
            )
        return found

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """Return the last boundary at or before ``instant``, or None.

        Parameters
        ----------
        instant
            A timezone-aware datetime, any zone (naive is not supported).

        Returns
        -------
        datetime | None
            Aware, in :data:`datetime.UTC`: the boundary ``b <= instant`` with
            ``next_after(b) > instant``.  None when there is none: for cron,
            none within cronsim's 50-year backward search (no accepted spec
            goes 50 years without a boundary) or before year 1; for
            ``@every``, only before year 1.
        """
        t = instant.astimezone(UTC)
        if self._every_us is not None:
            k = _us_since_epoch(t) // self._every_us
            try:
                return _EPOCH + timedelta(microseconds=k * self._every_us)
            except OverflowError:
                return None
        try:
            start = self._boundary_at_or_before(t)
        except OverflowError:  # the search ran past year 1
            return None
        if start is None:
            return None
        # start is a boundary <= t but, around a fall-back change, maybe not
        # the last one.  A later one needs an offset change within a day
        # after start (a wildcard job's wall time repeated after start's) or
        # within a day before t (a wall time after t's, reached earlier in
        # the higher offset before the change): without one, start is it.
        # This spares sampling the offset over a sparse spec's years.
        if self._offset_change(start, min(start + _NEAR_CHANGE, t), self._offset(start)) is None:
            near_t = max(start, t - _NEAR_CHANGE)
            if self._offset_change(near_t, t, self._offset(near_t)) is None:
                return start
        # Otherwise walk forward from start.
        latest = start
        for found in self._boundaries_after(start, until=t):
            if found > t:
                break
            latest = found
        return latest

    # --- cron: wall times from cronsim, instants from the zone's offsets

    def _boundaries_after(self, t: datetime, until: datetime | None = None) -> Iterator[datetime]:
        """Yield the cron boundaries after ``t`` (UTC), strictly increasing;
        with ``until``, maybe stop at the first one past it.

        Walks the stretches of constant UTC offset: within one, wall time
        ``w`` is the instant ``w - offset``; at a change, the wall times a
        gap skips fire once at its end (fixed-time) or not at all
        (wildcard), and the wall times a fall-back repeats fire only the
        first time (fixed-time) or again (wildcard).
        """
        assert self._cron is not None
        start = t  # the stretch from here on has offset `offset`
        offset = self._offset(t)
        walls = CronSim(self._cron, _wall(t, offset))  # wall times > wall(t)
        last: datetime | None = None
        while True:
            wall = next(walls, None)
            if wall is None:
                return
            candidate = _instant(wall, offset)
            # With `until`, look for changes only up to it: that is enough to
            # know nothing more comes before it (a sparse spec's candidate
            # can be years away).
            horizon = candidate if until is None else min(candidate, until)
            change = self._offset_change(start, horizon, offset)
            if change is None:
                if until is not None and candidate > until:
                    return
                # A real instant with this wall time; for a fixed-time job it
                # must be the wall time's first occurrence.
                start = candidate
                first = self._wildcard or self._first_occurrence(wall) == candidate
                if first and (last is None or candidate > last):
                    last = candidate
                    yield candidate
                continue
            new_offset = self._offset(change)
            # A fixed-time wall time in a spring-forward gap fires once, as the
            # gap ends.
            in_gap = new_offset > offset and wall < _wall(change, new_offset)
            if not self._wildcard and in_gap and (last is None or change > last):
                last = change
                yield change
            # Go on with the wall times from the change on, in its offset; a
            # fixed-time job skips those a fall-back repeats.
            restart = offset if not self._wildcard and new_offset < offset else new_offset
            start, offset = change, new_offset
            walls = CronSim(self._cron, _wall(change, restart) - _ONE_US)

    def _boundary_at_or_before(self, t: datetime) -> datetime | None:
        """Return a cron boundary ``<= t`` (UTC), near ``t``; or None.

        The instant of the last matching wall time ``<= wall(t)``: its first
        occurrence (or the gap's end, for a fixed-time job) is ``<= t`` and
        is a boundary.  Later boundaries ``<= t`` can exist only around a
        fall-back change; the caller walks forward to them.
        """
        assert self._cron is not None
        wall_t = _wall(t, self._offset(t))
        # cronsim 2.6 steps back a minute from the start truncated to the
        # minute, 2.7+ a second: from the next whole minute, both give the
        # wall times <= wall_t truncated to the minute.
        from_wall = wall_t.replace(second=0, microsecond=0) + _ONE_MINUTE
        for wall in CronSim(self._cron, from_wall, reverse=True):
            found = self._earliest(wall)
            if found is None:  # a wildcard job's wall time in a gap
                continue
            if found <= t:
                return found
        return None

    def _earliest(self, wall: datetime) -> datetime | None:
        """Return the first instant at ``wall`` in the zone; for a wall time
        in a gap, the gap's end (fixed-time) or None (wildcard)."""
        first = self._first_occurrence(wall)
        if _wall(first, self._offset(first)) == wall:
            return first
        if self._wildcard:
            return None
        # In a gap, fold=1 reads the wall time with the offset after the
        # change (an instant before it), fold=0 with the one before (after).
        before = wall.replace(tzinfo=self._zone, fold=1).astimezone(UTC)
        return self._bisect_change(before, first)

    def _first_occurrence(self, wall: datetime) -> datetime:
        # PEP 495: fold=0 is the first of two occurrences.
        return wall.replace(tzinfo=self._zone, fold=0).astimezone(UTC)

    def _offset(self, instant: datetime) -> timedelta:
        offset = instant.astimezone(self._zone).utcoffset()
        if offset is None:  # pragma: no cover - ZoneInfo always has one
            raise AssertionError(f"zone {self.timezone!r} has no offset at {instant}")
        return offset

    def _offset_change(self, start: datetime, end: datetime, offset: timedelta) -> datetime | None:
        """Return the first instant in ``(start, end]`` whose offset is not
        ``offset`` (the offset at ``start``), or None."""
        low = start
        while low < end:
            high = min(low + _OFFSET_STEP, end)
            if self._offset(high) != offset:
                return self._bisect_change(low, high)
            low = high
        return None

    def _bisect_change(self, low: datetime, high: datetime) -> datetime:
        """Return the instant in ``(low, high]`` where the offset at ``low``
        changes to the one at ``high`` (one change between them)."""
        offset = self._offset(low)
        while high - low > _ONE_US:
            middle = low + (high - low) // 2
            if self._offset(middle) == offset:
                low = middle
            else:
                high = middle
        return high


def parse_schedule(spec: object, timezone: object = "UTC") -> ScheduleSpec:
    """Validate a schedule and return it as a :class:`ScheduleSpec`.

    Parameters
    ----------
    spec
        A str: a 5-field cron expression (``minute hour day-of-month month
        day-of-week``, with what cronsim takes: ``*``, ranges ``a-b``, steps
        ``/n``, lists ``a,b``, names ``JAN``-``DEC`` and ``SUN``-``SAT`` in any
        case, ``L`` and ``LW`` in day-of-month, ``5L`` and ``MON#2`` in
        day-of-week; day-of-month and day-of-week are OR-ed unless one starts
        with ``*``, as in Debian cron); an alias ``@yearly``, ``@annually``,
        ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``, ``@hourly`` (any
        case); or ``@every <duration>``, the duration one or more
        ``<int><unit>`` with units ``d``, ``h``, ``m``, ``s`` (lower case,
        e.g. ``30s``, ``1h30m``), from 1 second to 100 years of 365.25 days.
        Whitespace around it is ignored.
    timezone
        A str, the IANA zone the cron fields are read in (default ``"UTC"``).
        Checked for ``@every`` too, though it does not affect it.

    Returns
    -------
    ScheduleSpec
        With ``spec`` stripped.

    Raises
    ------
    alkstore.errors.ValidationError
        If ``spec`` or ``timezone`` is not a str; the cron expression is
        invalid (not 5 fields, or refused by cronsim, whose error is kept as
        ``__cause__``) or never fires; the alias is unknown or ``@reboot``;
        the ``@every`` duration is malformed or out of range; the time zone is
        empty, path-like, ``localtime`` or unknown.  No other exception
        escapes.
    """
    return ScheduleSpec(_check_str(spec, "schedule spec"), _check_str(timezone, "time zone"))


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a str, got {type(value).__name__}")
    return value


def _load_zone(name: str) -> ZoneInfo:
    if not _ZONE_NAME.fullmatch(name) or name in _NOT_ZONES:
        raise ValidationError(f"time zone {name!r} is not an IANA zone name (like 'Europe/Paris')")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: a folder of the database, like 'America'.
        raise ValidationError(f"unknown time zone {name!r}") from exc


def _compile_spec(spec: str) -> tuple[str | None, int | None]:
    """Return ``(cron expression, None)`` or ``(None, @every microseconds)``."""
    if spec.startswith("@"):
        every = _EVERY.fullmatch(spec)
        if every is not None:
            return None, _every_us(spec, every.group("duration"))
        alias = spec.lower()
        if alias == "@reboot":
            raise ValidationError(
                f"schedule {spec!r} is not supported: @reboot has no boundaries in time"
            )
        if alias not in _ALIASES:
            raise ValidationError(
                f"unknown schedule alias {spec!r}; known: {', '.join(_ALIASES)}, @every"
            )
        return _compile_cron(spec, _ALIASES[alias]), None
    return _compile_cron(spec, spec), None


def _every_us(spec: str, duration: str | None) -> int:
    if duration is None or not _DURATION.fullmatch(duration):
        raise ValidationError(
            f"schedule {spec!r}: @every takes a duration such as 30s, 5m, 1h30m or 2d "
            "(whole numbers with units d, h, m, s), got "
            f"{'nothing' if duration is None else repr(duration)}"
        )
    total_s = 0
    for digits, unit in _DURATION_PART.findall(duration):
        if len(digits) > _MAX_DURATION_DIGITS:
            raise ValidationError(
                f"schedule {spec!r}: @every duration {duration!r} is longer than 100 years"
            )
        total_s += int(digits) * _UNIT_S[unit]
    if total_s < 1:
        raise ValidationError(
            f"schedule {spec!r}: @every duration {duration!r} is shorter than 1 second"
        )
    if total_s > _MAX_EVERY_S:
        raise ValidationError(
            f"schedule {spec!r}: @every duration {duration!r} is longer than 100 years"
        )
    return total_s * _US_PER_S


def _compile_cron(spec: str, expression: str) -> str:
    fields = expression.split()
    if len(fields) != 5:
        # cronsim 2.7+ would also take a 6-field form with seconds first;
        # Debian cron has none.
        raise ValidationError(
            f"invalid cron expression {spec!r}: expected 5 fields "
            f"(minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    cron = " ".join(fields)
    try:
        first = next(CronSim(cron, _PROBE), None)
    except Exception as exc:  # cronsim's CronSimError, and ValueError for huge numbers
        raise ValidationError(f"invalid cron expression {spec!r}: {exc}") from exc
    if first is None:
        raise ValidationError(f"cron expression {spec!r} never fires")
    return cron


def _wall(instant: datetime, offset: timedelta) -> datetime:
    """The naive wall-clock time of ``instant`` at ``offset``."""
    return (instant + offset).replace(tzinfo=None)


def _instant(wall: datetime, offset: timedelta) -> datetime:
    """The UTC instant of naive ``wall`` at ``offset``."""
    return (wall - offset).replace(tzinfo=UTC)


def _us_since_epoch(t: datetime) -> int:
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * _US_PER_S + delta.microseconds
