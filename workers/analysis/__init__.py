"""Analysis without Django: analyzer configurations and their fingerprints, the
streamed history of a repository, git's numstat records, content-defined chunks,
languages and the code version derived from this source. See docs/analysis.md."""

from __future__ import annotations

from workers.analysis.analyzer import (
    CODE_VERSION,
    DECLARED_EFFECT,
    DEFAULT,
    EFFECT_FIELDS,
    AnalyzerConfig,
    InvalidConfig,
    VersionNotLoaded,
    config_for,
    path_excluded,
    queue_name,
)
from workers.analysis.chunks import (
    ShaList,
    chunk_key,
    chunk_target,
    iter_chunks,
    iter_weighted_chunks,
)
from workers.analysis.code_version import derive as derive_code_version
from workers.analysis.history import list_commits, renamed_commits, stream_commits
from workers.analysis.numstat import CommitRecord, CommitTooLarge, HistoryError

__all__ = [
    "CODE_VERSION",
    "DECLARED_EFFECT",
    "DEFAULT",
    "EFFECT_FIELDS",
    "AnalyzerConfig",
    "CommitRecord",
    "CommitTooLarge",
    "HistoryError",
    "InvalidConfig",
    "ShaList",
    "VersionNotLoaded",
    "chunk_key",
    "chunk_target",
    "config_for",
    "derive_code_version",
    "iter_chunks",
    "iter_weighted_chunks",
    "list_commits",
    "path_excluded",
    "queue_name",
    "renamed_commits",
    "stream_commits",
]
