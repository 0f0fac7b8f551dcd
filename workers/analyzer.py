"""Analyzer versions: code version + config, identified by a fingerprint (DESIGN §7)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

#: Bump when the analysis code changes what it stores; the fingerprint changes with it.
CODE_VERSION = "1"


@dataclass(frozen=True)
class AnalyzerConfig:
    detect_renames: bool = False
    ignore_whitespace: bool = False
    exclude_paths: tuple[str, ...] = field(default_factory=tuple)

    def fingerprint(self) -> str:
        """A stable hash of code version + config: results are stored per fingerprint."""
        canonical = json.dumps(
            {"code": CODE_VERSION, "config": asdict(self)}, sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


DEFAULT = AnalyzerConfig()


def queue_name(fingerprint: str) -> str:
    """The physical queue behind the logical ``analysis`` queue for one version."""
    return f"analysis@{fingerprint[:8]}"
