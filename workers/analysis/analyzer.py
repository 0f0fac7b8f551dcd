"""Analyzer versions: code version + config, identified by a fingerprint (docs/rollouts.md).

An analyzer version is what a worker analyses with: :data:`CODE_VERSION` (derived from
the installed analysis code, ``workers.analysis.code_version``) plus one
:class:`AnalyzerConfig`.  Contracts:

* An ``AnalyzerConfig`` is immutable and always valid: the constructor checks types and
  values (:class:`InvalidConfig`, a ``ValueError`` naming the key) and normalises
  ``exclude_paths`` to a sorted tuple without duplicates (their order means nothing to
  git), so two spellings of one configuration are one version.
* :meth:`AnalyzerConfig.from_mapping` takes untrusted input (a parsed JSON/TOML config
  file, an API body): unknown keys and wrongly typed values are refused, never coerced.
  :meth:`AnalyzerConfig.from_assignments` takes CLI ``--set KEY=VALUE`` strings.
* :meth:`AnalyzerConfig.fingerprint` hashes exactly what the worker analyses with: the
  canonical JSON ``{"code": CODE_VERSION, "config": <canonical config>}`` (sorted keys, no
  whitespace, ASCII), SHA-256, first 16 hex digits.  It uses no ``hash()`` or ``repr``,
  so it is equal across processes, hosts and Python versions.  A change to the analysis
  code changes :data:`CODE_VERSION` and so every fingerprint: results of the old code stay
  stored under the old fingerprints, and the new code is rolled out beside the old one
  (docs/rollouts.md#code-rollouts-bluegreen).  With the code version ``"1"`` of the
  releases before it was derived, the default configuration's fingerprint is still
  ``01faaf06ff1b8dc2``.
* :func:`workers.analysis.history.stream_commits` turns the config into git arguments; nothing
  else interprets it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workers.analysis.code_version import derive as derive_code_version

__all__ = [
    "CODE_VERSION",
    "DECLARED_EFFECT",
    "DEFAULT",
    "EFFECT_FIELDS",
    "KEYS",
    "AnalyzerConfig",
    "InvalidConfig",
    "VersionNotLoaded",
    "config_for",
    "path_excluded",
    "queue_name",
]

#: The installed analysis code's version, ``<package version>+<source hash>``, computed
#: once per process (docs/analysis.md#code-version); the fingerprint changes with it.
CODE_VERSION = derive_code_version()

#: The fields of a stored result a change of the analysis may change
#: (docs/rollouts.md#result-contract): ``files`` — which file rows a commit has (and so
#: its ``files_changed``), ``insertions`` and ``deletions`` — the lines counted per file
#: and in total, ``binary`` — whether a file row counts as binary.
EFFECT_FIELDS = ("files", "insertions", "deletions", "binary")

#: What this code version declares it changes in the stored results, compared with the
#: code version before it: a subset of :data:`EFFECT_FIELDS`. Empty (the default) means
#: "the same numbers": a rollout of a new code version whose results differ in any other
#: field is stopped by the result contract (docs/rollouts.md#result-contract). Set it in
#: the same change that makes the analysis store different numbers.
DECLARED_EFFECT: frozenset[str] = frozenset()

#: Every configuration key, in documentation order.
KEYS = ("detect_renames", "ignore_whitespace", "exclude_paths")
MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 1024

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


class InvalidConfig(ValueError):
    """A configuration key or value is not acceptable; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class VersionNotLoaded(LookupError):
    """This worker has not loaded the analyzer version a job was planned for."""


def _check_bool(key: str, value: object) -> bool:
    # bool only: 0/1 and "true" are refused here (JSON, TOML and Python give real
    # booleans); from_assignments converts CLI strings before they get here.
    if not isinstance(value, bool):
        raise InvalidConfig(key, f"must be true or false, not {_show(value)}")
    return value


def _check_pattern(key: str, pattern: object) -> str:
    if not isinstance(pattern, str):
        raise InvalidConfig(key, f"every pattern must be a string, not {_show(pattern)}")
    if not pattern:
        raise InvalidConfig(key, "a pattern must not be empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidConfig(key, f"a pattern must be at most {MAX_PATTERN_LENGTH} characters")
    if "\0" in pattern:
        raise InvalidConfig(key, f"pattern {pattern!r} contains a NUL character")
    if pattern.startswith("/"):
        raise InvalidConfig(
            key, f"pattern {pattern!r} must be relative to the repository root (no leading /)"
        )
    if pattern.startswith(":"):
        raise InvalidConfig(
            key,
            f"pattern {pattern!r} starts with ':' (git pathspec magic is not allowed; "
            "patterns are always used as :(exclude,glob)PATTERN)",
        )
    if any(part in (".", "..") for part in pattern.split("/")):
        raise InvalidConfig(key, f"pattern {pattern!r} must not contain '.' or '..' segments")
    return pattern


def _check_patterns(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidConfig(
            key, f"must be a list of glob patterns, not a string (write [{json.dumps(value)}])"
        )
    if not isinstance(value, list | tuple):
        raise InvalidConfig(key, f"must be a list of glob patterns, not {_show(value)}")
    patterns = sorted({_check_pattern(key, p) for p in value})
    if len(patterns) > MAX_PATTERNS:
        raise InvalidConfig(key, f"at most {MAX_PATTERNS} patterns")
    return tuple(patterns)


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class AnalyzerConfig:
    """What an analyzer version changes in the analysis (docs/analysis.md#analyzer-configuration).

    * ``detect_renames``: a renamed file is one row (``git log -M``); the path is the new
      one, the old one is kept in ``FileStat.old_path``.
    * ``ignore_whitespace``: lines that differ only in whitespace are not counted
      (``git log -w``).
    * ``exclude_paths``: git glob pathspecs (``:(exclude,glob)PATTERN``, matched from the
      repository root: ``*`` stays inside one directory, ``**`` crosses them, so
      ``vendor/**`` is everything under ``vendor/`` and ``**/*.min.js`` is every minified
      file); matching files vanish from files and totals, commits stay.
    """

    detect_renames: bool = False
    ignore_whitespace: bool = False
    exclude_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_bool("detect_renames", self.detect_renames)
        _check_bool("ignore_whitespace", self.ignore_whitespace)
        # frozen: the normalised tuple is set once, here, before anyone sees the object
        object.__setattr__(
            self, "exclude_paths", _check_patterns("exclude_paths", self.exclude_paths)
        )

    @classmethod
    def from_mapping(cls, data: object) -> AnalyzerConfig:
        """Build from a parsed config file or API body; missing keys take their defaults.

        Raises :class:`InvalidConfig` naming the first bad key: not a mapping, an unknown
        key (with a suggestion), a non-boolean flag, or a bad pattern list.
        """
        if not isinstance(data, Mapping):
            raise InvalidConfig("config", f"must be an object of settings, not {_show(data)}")
        values: dict[str, Any] = {}
        for key in sorted(data, key=str):
            if not isinstance(key, str) or key not in KEYS:
                raise InvalidConfig(str(key), _unknown(str(key)))
            values[key] = data[key]
        return cls(**values)

    @classmethod
    def from_assignments(cls, items: Iterable[str]) -> AnalyzerConfig:
        """Build from CLI ``--set KEY=VALUE`` strings.

        Flags take ``true/false`` (also ``yes/no``, ``on/off``, ``1/0``); each
        ``exclude_paths=PATTERN`` adds one pattern (repeat it for more).  A flag given
        twice is refused rather than silently overridden.
        """
        values: dict[str, Any] = {}
        patterns: list[str] = []
        for item in items:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise InvalidConfig(item, "expected KEY=VALUE")
            if key not in KEYS:
                raise InvalidConfig(key, _unknown(key))
            if key == "exclude_paths":
                patterns.append(raw)
                continue
            if key in values:
                raise InvalidConfig(key, "given twice")
            word = raw.strip().lower()
            if word not in _TRUE | _FALSE:
                raise InvalidConfig(key, f"must be true or false, not {json.dumps(raw)}")
            values[key] = word in _TRUE
        if patterns:
            values["exclude_paths"] = patterns
        return cls.from_mapping(values)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-safe data (``from_mapping`` reads it back)."""
        return {
            "detect_renames": self.detect_renames,
            "exclude_paths": list(self.exclude_paths),
            "ignore_whitespace": self.ignore_whitespace,
        }

    def canonical_json(self) -> str:
        """The exact text the fingerprint hashes (inside ``{"code", "config"}``)."""
        return _canonical(self.to_dict())

    def fingerprint(self, code_version: str = CODE_VERSION) -> str:
        """A stable hash of code version + config: results are stored per fingerprint."""
        canonical = _canonical({"code": code_version, "config": self.to_dict()})
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def is_default(self) -> bool:
        return self == DEFAULT


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _unknown(key: str) -> str:
    close = difflib.get_close_matches(key, KEYS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {key!r} (known: {', '.join(KEYS)}){hint}"


DEFAULT = AnalyzerConfig()


def config_for(
    fingerprint: str, *, loaded: Iterable[AnalyzerConfig] = (DEFAULT,)
) -> AnalyzerConfig:
    """The loaded configuration whose fingerprint is ``fingerprint``.

    A worker analyses a chunk with exactly the version the chunk was planned for, or not
    at all: storing one version's numbers under another's fingerprint is the bug this
    guards against.  A worker loads the versions the pool started it for (``manage.py
    worker --analyzer FP``: the version's config read from its row, docs/rollouts.md); the
    default loads :data:`DEFAULT` only.  Raises :class:`VersionNotLoaded`.
    """
    configs = list(loaded)
    for config in configs:
        if config.fingerprint() == fingerprint:
            return config
    have = ", ".join(c.fingerprint() for c in configs) or "none"
    raise VersionNotLoaded(
        f"analyzer version {fingerprint} is not loaded by this worker (loaded: {have})"
    )


def _glob_regex(pattern: str) -> str:
    """A git ``:(glob)`` pattern as a regular expression (git's wildmatch with
    ``WM_PATHNAME``): ``*`` and ``?`` stay inside one directory, ``**/`` is any number of
    leading directories, ``/**`` everything below, ``[...]`` a class (``!`` or ``^``
    negates), ``\\`` escapes."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*" and pattern.startswith("**", i):
            j = i + 2
            at_start = i == 0 or pattern[i - 1] == "/"
            if at_start and j < n and pattern[j] == "/":
                out.append("(?:.*/)?")
                i = j + 1
                continue
            if at_start and j == n:
                out.append(".*")
                i = j
                continue
            out.append("[^/]*")  # other consecutive asterisks are one asterisk
            while i < n and pattern[i] == "*":
                i += 1
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                body = body.replace("\\", "\\\\").replace("^", "\\^")
                out.append(f"[^/{body}]" if negate else f"(?!/)[{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _has_wildcard(pattern: str) -> bool:
    return any(c in pattern for c in "*?[\\")


def path_excluded(path: str, patterns: Iterable[str]) -> bool:
    """Whether git's ``:(exclude,glob)PATTERN`` pathspecs (``exclude_paths``) leave
    ``path`` out: a pattern with a wildcard must match the whole path; one without is
    the path itself or one of its leading directories (``vendor`` takes
    ``vendor/a/b.js``). ``tests/workers/analysis/test_analyzer.py`` checks it against
    git itself."""
    for pattern in patterns:
        if _has_wildcard(pattern):
            if re.fullmatch(_glob_regex(pattern), path, flags=re.DOTALL):
                return True
        else:
            literal = pattern.rstrip("/")
            if path == literal or path.startswith(literal + "/"):
                return True
    return False


def queue_name(fingerprint: str) -> str:
    """The physical queue behind the logical ``analysis`` queue for one version."""
    return f"analysis@{fingerprint[:8]}"
