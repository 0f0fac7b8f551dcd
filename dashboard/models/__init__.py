"""gitward's tables, one module per domain noun. Behaviour of one row lives with its
model; multi-model work lives in the ``dashboard/<noun>.py`` modules.

Django finds the models through this package; every model is re-exported here, so
``from dashboard.models import Repository`` stays the one way to import them.
"""

from __future__ import annotations

from dashboard.models.accounts import ApiToken, AuditEntry
from dashboard.models.jobs import (
    BulkAction,
    FenceToken,
    JobAttempt,
    JobRun,
    QueueSample,
    WorkerBeat,
)
from dashboard.models.repositories import (
    AuthorMonth,
    AuthorWeek,
    Chunk,
    CoAuthor,
    Commit,
    CommitCount,
    CouplingAggregate,
    CouplingBlockStamp,
    CouplingStamp,
    DirAggregate,
    FairGroup,
    FileChange,
    MonthAggregate,
    MonthStamp,
    Repository,
    RepositoryView,
    Summary,
    Verification,
)
from dashboard.models.rollouts import (
    AnalyzerVersion,
    FreezeSwitch,
    Rollout,
    RolloutEvent,
    RolloutMeasurement,
    RolloutNotification,
    RolloutPin,
)

__all__ = [
    "AnalyzerVersion",
    "ApiToken",
    "AuditEntry",
    "AuthorMonth",
    "AuthorWeek",
    "BulkAction",
    "Chunk",
    "CoAuthor",
    "Commit",
    "CommitCount",
    "CouplingAggregate",
    "CouplingBlockStamp",
    "CouplingStamp",
    "DirAggregate",
    "FairGroup",
    "FenceToken",
    "FileChange",
    "FreezeSwitch",
    "JobAttempt",
    "JobRun",
    "MonthAggregate",
    "MonthStamp",
    "QueueSample",
    "Repository",
    "RepositoryView",
    "Rollout",
    "RolloutEvent",
    "RolloutMeasurement",
    "RolloutNotification",
    "RolloutPin",
    "Summary",
    "Verification",
    "WorkerBeat",
]
