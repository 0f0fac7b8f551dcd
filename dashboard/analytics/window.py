"""The time window every analysis takes (docs/analytics.md#the-window): ``since`` and
``until`` as ISO dates (UTC days, both included), or a preset of the last 30, 90 or 365
days; a commit is inside when its committer date is, as for ``git log --since --until``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.utils import timezone

#: The presets the pages offer and ``last`` accepts: a number of days ending at ``until``.
PRESETS = (30, 90, 365)


class BadWindow(ValueError):
    """A ``since``/``until``/``last`` the window cannot be built from; the message says which."""


@dataclass(frozen=True)
class Window:
    """``[start, end)`` in UTC; ``None`` is unbounded on that side (the whole history)."""

    start: datetime | None = None
    end: datetime | None = None

    @property
    def since(self) -> date | None:
        return self.start.date() if self.start else None

    @property
    def until(self) -> date | None:
        """The last day inside (``end`` is the midnight after it)."""
        return (self.end - timedelta(days=1)).date() if self.end else None

    def reference(self) -> datetime:
        """The instant ages and inactivity are measured from: the window's end, else now."""
        return self.end or timezone.now()

    def git_args(self) -> list[str]:
        """The ``git log`` options selecting the same commits (docs/analytics.md#reproduce)."""
        args = []
        if self.start:
            args.append(f"--since={self.start:%Y-%m-%dT%H:%M:%SZ}")
        if self.end:
            args.append(f"--until={self.end - timedelta(seconds=1):%Y-%m-%dT%H:%M:%SZ}")
        return args

    def as_dict(self) -> dict[str, str | None]:
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }


def _day(value: str, name: str) -> date:
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise BadWindow(f"{name} must be an ISO date (YYYY-MM-DD), not {value[:40]!r}") from None


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def parse_window(
    since: str | None = None, until: str | None = None, last: str | int | None = None
) -> Window:
    """The window from request or command-line values; empty strings count as absent.

    ``last`` (30, 90 or 365) is the days ending at ``until`` (default: today, UTC), and
    excludes ``since``. ``BadWindow`` for a malformed date, an unknown preset, both
    ``since`` and ``last``, ``since`` after ``until``, or a window past the dates Python
    holds (``until`` on 9999-12-31, ``last`` reaching before year 1)."""
    since = since or None
    until = until or None
    last = last or None
    end_day = _day(until, "until") if until else None
    if end_day == date.max:  # its end, the midnight after it, is past what a date holds
        raise BadWindow(f"until must be before {date.max.isoformat()}")
    end = _midnight(end_day + timedelta(days=1)) if end_day else None
    if last is not None:
        if since is not None:
            raise BadWindow("give since or last, not both")
        try:
            days = int(last)
        except (TypeError, ValueError):
            raise BadWindow(f"last must be one of {', '.join(map(str, PRESETS))}") from None
        if days not in PRESETS:
            raise BadWindow(f"last must be one of {', '.join(map(str, PRESETS))}")
        if end is None:
            end = _midnight(timezone.now().astimezone(UTC).date() + timedelta(days=1))
        if end - datetime.min.replace(tzinfo=UTC) < timedelta(days=days):
            raise BadWindow(f"the last {days} days before until start before year 1")
        return Window(end - timedelta(days=days), end)
    start = _midnight(_day(since, "since")) if since else None
    if start and end and start >= end:
        raise BadWindow("since must not be after until")
    return Window(start, end)
