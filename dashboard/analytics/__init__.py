"""Analytics over the stored commits and file changes of a repository, for the served
analyzer fingerprint and inside a time window: change coupling, ownership and knowledge,
code age and hotspots with their trend, per file and rolled up by directory. Read-only, in
SQL over the rows ``dashboard.repositories`` writes. See docs/analytics.md."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.analytics.age import (
        directory_age,
        file_age,
    )
    from dashboard.analytics.coupling import (
        Thresholds,
        coupled_with,
        directory_coupling,
        file_coupling,
    )
    from dashboard.analytics.export import (
        EXPORT_COLUMNS,
        FORMATS,
        MAX_REPOSITORIES,
        WHATS,
        Export,
        content_type,
        export_lines,
        export_rows,
        ndjson_lines,
        parse_export,
        parse_repository_ids,
    )
    from dashboard.analytics.hotspots import (
        directory_hotspots,
        file_hotspots,
    )
    from dashboard.analytics.integrity import (
        badge_text,
        clear_mismatch,
        mismatch_marks_of,
        mismatch_text,
        open_mismatch_count,
        open_mismatch_marks,
        open_mismatches,
        run_verification,
        schedule_verifications,
        verification_metrics,
        verification_status,
        withheld_reason,
    )
    from dashboard.analytics.lenses import (
        LENSES,
        RULESET,
        Lens,
        UnknownLens,
        build_lens,
        parse_exclude,
    )
    from dashboard.analytics.ownership import (
        directory_ownership,
        file_ownership,
        knowledge_at_risk,
    )
    from dashboard.analytics.people import author_activity, authors, file_history
    from dashboard.analytics.precomputation import (
        PrecomputeResult,
        enqueue_precompute,
        precompute,
        precompute_status,
        run_precompute,
    )
    from dashboard.analytics.reports import (
        INTEGERS,
        KINDS,
        BadParameter,
        NotFound,
        Params,
        csv_lines,
        parse_params,
        report,
        tables,
    )
    from dashboard.analytics.rows import (
        MAX_DEPTH,
        Scope,
        directory_of,
    )
    from dashboard.analytics.verify import CannotVerify, verify_repository
    from dashboard.analytics.window import (
        PRESETS,
        BadWindow,
        Window,
        parse_window,
    )

__all__ = [
    "EXPORT_COLUMNS",
    "FORMATS",
    "INTEGERS",
    "KINDS",
    "LENSES",
    "MAX_DEPTH",
    "MAX_REPOSITORIES",
    "PRESETS",
    "RULESET",
    "WHATS",
    "BadParameter",
    "BadWindow",
    "CannotVerify",
    "Export",
    "Lens",
    "NotFound",
    "Params",
    "PrecomputeResult",
    "Scope",
    "Thresholds",
    "UnknownLens",
    "Window",
    "author_activity",
    "authors",
    "badge_text",
    "build_lens",
    "clear_mismatch",
    "content_type",
    "coupled_with",
    "csv_lines",
    "directory_age",
    "directory_coupling",
    "directory_hotspots",
    "directory_of",
    "directory_ownership",
    "enqueue_precompute",
    "export_lines",
    "export_rows",
    "file_age",
    "file_coupling",
    "file_history",
    "file_hotspots",
    "file_ownership",
    "knowledge_at_risk",
    "mismatch_marks_of",
    "mismatch_text",
    "ndjson_lines",
    "open_mismatch_count",
    "open_mismatch_marks",
    "open_mismatches",
    "parse_exclude",
    "parse_export",
    "parse_params",
    "parse_repository_ids",
    "parse_window",
    "precompute",
    "precompute_status",
    "report",
    "run_precompute",
    "run_verification",
    "schedule_verifications",
    "tables",
    "verification_metrics",
    "verification_status",
    "verify_repository",
    "withheld_reason",
]

#: Each public name and the module that defines it, loaded on first read (PEP 562); see
#: docs/architecture.md#package-surfaces.
_SURFACE: dict[str, str] = {
    "LENSES": "dashboard.analytics.lenses",
    "RULESET": "dashboard.analytics.lenses",
    "Lens": "dashboard.analytics.lenses",
    "UnknownLens": "dashboard.analytics.lenses",
    "parse_exclude": "dashboard.analytics.lenses",
    "build_lens": "dashboard.analytics.lenses",
    "badge_text": "dashboard.analytics.integrity",
    "clear_mismatch": "dashboard.analytics.integrity",
    "mismatch_marks_of": "dashboard.analytics.integrity",
    "mismatch_text": "dashboard.analytics.integrity",
    "open_mismatch_count": "dashboard.analytics.integrity",
    "open_mismatch_marks": "dashboard.analytics.integrity",
    "open_mismatches": "dashboard.analytics.integrity",
    "run_verification": "dashboard.analytics.integrity",
    "schedule_verifications": "dashboard.analytics.integrity",
    "verification_metrics": "dashboard.analytics.integrity",
    "verification_status": "dashboard.analytics.integrity",
    "withheld_reason": "dashboard.analytics.integrity",
    "CannotVerify": "dashboard.analytics.verify",
    "verify_repository": "dashboard.analytics.verify",
    "author_activity": "dashboard.analytics.people",
    "authors": "dashboard.analytics.people",
    "file_history": "dashboard.analytics.people",
    "INTEGERS": "dashboard.analytics.reports",
    "KINDS": "dashboard.analytics.reports",
    "BadParameter": "dashboard.analytics.reports",
    "Params": "dashboard.analytics.reports",
    "NotFound": "dashboard.analytics.reports",
    "parse_params": "dashboard.analytics.reports",
    "report": "dashboard.analytics.reports",
    "tables": "dashboard.analytics.reports",
    "csv_lines": "dashboard.analytics.reports",
    "directory_age": "dashboard.analytics.age",
    "file_age": "dashboard.analytics.age",
    "Thresholds": "dashboard.analytics.coupling",
    "coupled_with": "dashboard.analytics.coupling",
    "file_coupling": "dashboard.analytics.coupling",
    "directory_coupling": "dashboard.analytics.coupling",
    "EXPORT_COLUMNS": "dashboard.analytics.export",
    "FORMATS": "dashboard.analytics.export",
    "MAX_REPOSITORIES": "dashboard.analytics.export",
    "WHATS": "dashboard.analytics.export",
    "Export": "dashboard.analytics.export",
    "content_type": "dashboard.analytics.export",
    "export_lines": "dashboard.analytics.export",
    "export_rows": "dashboard.analytics.export",
    "ndjson_lines": "dashboard.analytics.export",
    "parse_export": "dashboard.analytics.export",
    "parse_repository_ids": "dashboard.analytics.export",
    "directory_hotspots": "dashboard.analytics.hotspots",
    "file_hotspots": "dashboard.analytics.hotspots",
    "directory_ownership": "dashboard.analytics.ownership",
    "file_ownership": "dashboard.analytics.ownership",
    "knowledge_at_risk": "dashboard.analytics.ownership",
    "MAX_DEPTH": "dashboard.analytics.rows",
    "Scope": "dashboard.analytics.rows",
    "directory_of": "dashboard.analytics.rows",
    "PrecomputeResult": "dashboard.analytics.precomputation",
    "enqueue_precompute": "dashboard.analytics.precomputation",
    "run_precompute": "dashboard.analytics.precomputation",
    "precompute": "dashboard.analytics.precomputation",
    "precompute_status": "dashboard.analytics.precomputation",
    "BadWindow": "dashboard.analytics.window",
    "PRESETS": "dashboard.analytics.window",
    "Window": "dashboard.analytics.window",
    "parse_window": "dashboard.analytics.window",
}


def __getattr__(name: str) -> object:
    try:
        module = _SURFACE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
