"""The OpenAPI 3.1 document of the JSON API, served at ``GET /api/openapi.json``
(docs/api.md#the-schema).

It is a data structure maintained here by hand, beside the resources it describes, not
generated: ``tests/dashboard/api/test_openapi.py`` checks that every route under
``/api/`` in the URLconf is in it, and that real responses of every operation validate
against it; ``tests/system/test_api_fuzz.py`` sends Schemathesis's requests, generated
from it, to a live server and counts the server errors (there must be none).

Objects list the fields clients rely on as ``required`` and allow more
(``additionalProperties`` is left open): a new field is not a breaking change.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard import analytics
from dashboard.api.endpoint import error

# ---------------------------------------------------------------------------- helpers

JSON = "application/json"
ID = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
TIME = {"type": "string", "format": "date-time"}
TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
STR_OR_NULL = {"type": ["string", "null"]}
CSV = "text/csv"
NDJSON = "application/x-ndjson"
COUNT = {"type": "integer", "minimum": 0}
DATE_OR_NULL = {"type": ["string", "null"], "format": "date"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **(optional or {})},
    }


def _ok(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


#: The error answers every operation may give (docs/api.md): each ``{"error": ...}``.
_ERRORS = {
    "400": "a malformed request: a parameter, a body, a limit (docs/api.md#limits)",
    "401": "no session and no bearer token, or an unknown token",
    "403": "a missing permission, or a session write without its CSRF token",
    "404": "no such object, or no such route (an id past 2^63-1 included)",
    "405": "the method is not allowed here (the Allow header names those that are)",
    "413": "the body is larger than the upload limit",
    "429": "over the rate limit (Retry-After says when to come back)",
    "503": "a Redis server or the database is not answering (Retry-After)",
}


def _responses(ok: dict[str, Any], *extra: str) -> dict[str, Any]:
    """``ok`` (status → response) and the error answers: the common ones and ``extra``
    (``"409"``)."""
    out = dict(ok)
    for status in [*_ERRORS, *extra]:
        why = _ERRORS.get(status, "the object's state does not allow this now")
        out[status] = {"description": why, "content": {JSON: {"schema": _ref("Error")}}}
    return out


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON request body (form fields with the same names are accepted too)."""
    return {"required": False, "content": {JSON: {"schema": schema}}}


def _path(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema,
            "description": description}  # fmt: skip


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}  # fmt: skip


def _op(summary: str, responses: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": responses, **more}


# ---------------------------------------------------------------------------- schemas

_CHUNKS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}

SCHEMAS: dict[str, Any] = {
    "Error": {
        **_obj({"error": {"type": "string"}}),
        "description": "Every 4xx and 5xx answer of the API.",
    },
    "Repository": _obj(
        {
            "id": ID,
            "url": {"type": "string"},
            "name": {"type": "string"},
            "branch": {"type": "string"},
            "status": {"enum": ["queued", "syncing", "analyzing", "ready", "failed"]},
            "head": STR_OR_NULL,
            "commits_total": {"type": "integer", "minimum": 0},
            "commits_analyzed": {"type": "integer", "minimum": 0},
            "progress": {"type": "number", "minimum": 0, "maximum": 100},
            "chunks": _CHUNKS,
            "fingerprint": {"type": "string"},
            "error": STR_OR_NULL,
            "created_at": TIME,
            "analyzed_at": TIME_OR_NULL,
        },
        {
            "summary": {"type": ["object", "null"]},
            "waiting": {"oneOf": [_ref("Waiting"), {"type": "null"}]},
            "verification": {"oneOf": [_ref("Verification"), {"type": "null"}]},
            "aggregates": {"oneOf": [_ref("AggregatesPrecompute"), {"type": "null"}]},
            "withheld": STR_OR_NULL,
        },
    ),
    "AggregatesPrecompute": _obj(
        {
            "state": {"enum": ["cold", "queued", "computing", "current", "stale"]},
            "since": TIME_OR_NULL,
            "at": TIME_OR_NULL,
            "spans": {"type": ["integer", "null"], "minimum": 0},
            "text": {"type": "string"},
        },
        {"busy": {"type": "integer", "minimum": 0}},
    )
    | {
        "description": "Whether the aggregates the whole-history analytics read are "
        "computed (docs/analytics.md#precomputation): `queued` or `computing` since "
        "`since`; `current` as of the last precompute job (`at`, `spans` months and "
        "years, `busy` left to readers); `stale` when commits were written or a month "
        "became whole since; `cold` before any precompute job. Null while the queue "
        "server is unreachable."
    },
    "Waiting": _obj(
        {
            "position": {"type": ["integer", "null"], "minimum": 1},
            "eta_seconds": {"type": ["number", "null"], "minimum": 0},
            "reason": {"type": "string"},
            "class": {"enum": ["interactive", "refresh", "catch-up", "verification"]},
        }
    )
    | {
        "description": "Why a queued run or a repository in progress waits "
        "(docs/scheduling.md#why-is-this-waiting): its place in its queue (1: next; null: "
        "in no line, e.g. a retry scheduled for later), an estimate from the queue's recent "
        "throughput, and what holds it. Null for a run or repository that waits for nothing."
    },
    "Verification": _obj(
        {
            "state": {"enum": ["pending", "ok", "mismatch", "cleared"]},
            "fingerprint": {"type": "string"},
            "head": STR_OR_NULL,
            "sampled": COUNT,
            "mismatches": COUNT,
            "details": {"type": "array", "items": _ref("IntegrityMismatch")},
            "checked_at": TIME_OR_NULL,
            "age_seconds": {"type": ["number", "null"], "minimum": 0},
            "next_at": TIME_OR_NULL,
            "in_flight": {"type": "boolean"},
            "withheld": {"type": "boolean"},
            "reason": STR_OR_NULL,
            "cleared_by": STR_OR_NULL,
            "cleared_at": TIME_OR_NULL,
            "policy": {"enum": ["flag", "withhold"]},
            "badge": {"type": "string", "description": "the line the pages show"},
        }
    ),
    "IntegrityMismatch": _obj(
        {
            "sha": {"type": "string", "description": "the commit; empty for the totals"},
            "path": {"type": "string"},
            "field": {"type": "string", "description": "added, deleted, binary, row, totals.*"},
            "git": {},
            "stored": {},
        }
    ),
    "IntegrityGroup": _obj(
        {
            "open": COUNT,
            "mismatches": {
                "type": "array",
                "items": {
                    "allOf": [
                        _ref("Verification"),
                        _obj(
                            {
                                "id": ID,
                                "repository": _obj(
                                    {
                                        "id": ID,
                                        "name": {"type": "string"},
                                        "url": {"type": "string"},
                                    }
                                ),
                            }
                        ),
                    ]
                },
            },
        }
    ),
    "IntegrityCleared": _obj({"cleared": {"type": "boolean"}, "id": ID}),
    "FileChange": _obj(
        {
            "path": {"type": "string"},
            "added": {"type": ["integer", "null"]},
            "deleted": {"type": ["integer", "null"]},
            "binary": {"type": "boolean"},
            "language": {"type": "string"},
        }
    ),
    "Commit": _obj(
        {
            "sha": {"type": "string", "pattern": "^[0-9a-f]{40}$"},
            "parents": {"type": "array", "items": {"type": "string"}},
            "author_name": {"type": "string"},
            "author_email": {"type": "string"},
            "authored_at": TIME,
            "committer_name": {"type": "string"},
            "committer_email": {"type": "string"},
            "committed_at": TIME,
            "subject": {"type": "string"},
            "is_merge": {"type": "boolean"},
            "files_changed": {"type": "integer", "minimum": 0},
            "insertions": {"type": "integer", "minimum": 0},
            "deletions": {"type": "integer", "minimum": 0},
        },
        {"files": {"type": "array", "items": _ref("FileChange")}},
    ),
    "CommitPage": _obj(
        {"results": {"type": "array", "items": _ref("Commit")}, "next": STR_OR_NULL}
    ),
    "CommitDetails": _obj(
        {
            "sha": {"type": "string"},
            "parents": {"type": "array", "items": {"type": "string"}},
            "is_merge": {"type": "boolean"},
            "subject": {"type": "string"},
            "message": {"type": "string"},
            "author": _obj(
                {
                    "name": {"type": "string"},
                    "email": {"type": "string"},
                    "date": {"type": "string"},
                }
            ),
            "committer": {"type": "object"},
            "files_changed": {"type": "integer"},
            "insertions": {"type": "integer"},
            "deletions": {"type": "integer"},
            "files": {"type": "array", "items": {"type": "object"}},
            "mirror": _obj({"available": {"type": "boolean"}}),
            "patch": {"type": "object"},
        }
    ),
    "Reanalysis": _obj({"repository": ID, "outcome": {"type": "string"}}),
    "HookSecret": _obj({"repository": ID, "secret": {"type": "string"}, "url": {"type": "string"}}),
    "PushAccepted": _obj(
        {"repository": ID, "provider": {"type": "string"}, "outcome": {"type": "string"}}
    ),
    "Cancelled": {
        **_obj(
            {
                "cancelled": {"type": "integer", "minimum": 0},
                "runs": {"type": "array", "items": ID},
                "dequeued": {"type": "integer", "minimum": 0},
                "stopped": {"type": "integer", "minimum": 0},
                "fenced": {"type": "array", "items": {"type": "string"}},
            },
            {"repository": ID, "status": {"type": "string"}, "error": STR_OR_NULL},
        ),
        "description": "What a cancel did (docs/lifecycle.md#cancelling).",
    },
    "RunRepository": _obj({"id": ID, "url": {"type": "string"}}),
    "Run": _obj(
        {
            "id": ID,
            "job_id": {"type": "string"},
            "kind": {"type": "string"},
            "state": {"type": "string"},
            "repository": _ref("RunRepository"),
            "chunk": {"type": ["integer", "null"]},
            "fingerprint": {"type": "string"},
            "attempts": {"type": "integer", "minimum": 0},
            "worker": {"type": "string"},
            "error": {"type": "string"},
            "cause": {"type": "string"},
            "group": {"type": "string"},
            "finished_at": TIME_OR_NULL,
        },
        {"history": {"type": "array", "items": {"type": "object"}}},
    ),
    "RunPage": _obj(
        {
            "results": {"type": "array", "items": _ref("Run")},
            "next": ID | {"type": ["integer", "null"]},
        }
    ),
    "RunTrace": _obj(
        {
            "id": ID,
            "job_id": {"type": "string"},
            "trace_id": {"type": "string"},
            "kind": {"type": "string"},
            "state": {"type": "string"},
            "repository": _ref("RunRepository"),
            "attempts": {"type": "integer", "minimum": 0},
            "waiting": {"oneOf": [_ref("Waiting"), {"type": "null"}]},
        }
    ),
    "Status": _obj(
        {
            "locks": {"type": "array"},
            "queues": {"type": ["array", "object"]},
            "workers": {"type": "array"},
            "dlq": {"type": "object"},
            "redis_nodes": {"type": "array"},
            "quorum": {},
            "queue_server": _obj({"ok": {"type": "boolean"}}),
            "live_events_dropped": {"type": "integer", "minimum": 0},
        }
    ),
    "DeadLetterGroup": _obj(
        {
            "group": {"type": "string"},
            "cause": {"type": "string"},
            "count": {"type": "integer", "minimum": 1},
            "first_seen": TIME_OR_NULL,
            "last_seen": TIME_OR_NULL,
            "repositories": {"type": "integer", "minimum": 0},
            "versions": {},
        }
    ),
    "DeadLetters": _obj(
        {
            "groups": {"type": "array", "items": _ref("DeadLetterGroup")},
            "dead": {"type": "integer", "minimum": 0},
        }
    ),
    "DeadLetterRuns": _obj(
        {"group": {"type": "string"}, "runs": {"type": "array", "items": _ref("Run")}}
    ),
    "DeadLetterAction": {
        "description": 'Exactly one of "runs", "group", "all".',
        "type": "object",
        "properties": {
            "runs": {"type": "array", "items": ID, "minItems": 1, "maxItems": 100},
            "group": {"type": "string", "pattern": "^[A-Za-z0-9]+$"},
            "all": {"const": True},
        },
        "minProperties": 1,
        "maxProperties": 1,
    },
    "Moved": _obj({"moved": {"type": "integer", "minimum": 0}}),
    "BulkAction": _obj(
        {
            "id": ID,
            "kind": {"enum": ["retry", "discard"]},
            "selector": {"type": "object"},
            "state": {"type": "string"},
            "total": {"type": "integer", "minimum": 0},
            "done": {"type": "integer", "minimum": 0},
            "error": STR_OR_NULL,
        }
    ),
    "QueueChange": _obj(
        {"queue": {"type": "string"}, "paused": {"type": "boolean"}, "changed": {"type": "boolean"}}
    ),
    "LockRelease": _obj(
        {"released": {"type": "integer", "minimum": 0}, "token": {"type": ["integer", "null"]}},
        {"holder": {}},
    ),
    "Rollout": _obj(
        {
            "id": ID,
            "queue": {"type": "string"},
            "state": {"type": "string"},
            "version": {"type": "object"},
            "previous": {"type": ["object", "null"]},
            "steps": {"type": "array", "items": {"type": "integer"}},
            "step_index": {"type": "integer"},
            "auto": {"type": "boolean"},
            "created_at": TIME,
            "finished_at": TIME_OR_NULL,
            # docs/rollouts.md#waiting-reason: what an active rollout waits for, else null.
            "waiting": {
                "oneOf": [
                    {"type": "null"},
                    _obj({"reason": {"type": "string"}, "until": TIME_OR_NULL}),
                ]
            },
        },
        {
            "timeline": {"type": "array", "items": {"type": "object"}},
            # docs/rollouts.md#result-contract: {} until the first check.
            "contract": {"type": "object"},
            # docs/rollouts.md#checks-and-gates: each step's check and gate measurements.
            "measurements": {"type": "array", "items": _ref("StepMeasurements")},
            # docs/rollouts.md#pinning
            "pins": {"type": "array", "items": _ref("Pin")},
        },
    ),
    "StepMeasurements": _obj(
        {
            "step_index": {"type": "integer"},
            "percent": {"type": "integer"},
            "checks": {"type": "array", "items": _ref("Measured")},
            "gates": {"type": "array", "items": _ref("Measured")},
        }
    ),
    "Measured": _obj(
        {
            "name": {"type": "string"},
            "dry_run": {"type": "boolean"},
            "outcome": {"enum": ["success", "failure", "inconclusive"]},
            "value": {"type": ["number", "null"]},
            "condition": {"type": "string"},
            "message": {"type": "string"},
            "counts": {"type": "object"},
            "latest": {"type": "array", "items": {"type": "object"}},
        }
    ),
    "Pin": _obj(
        {
            "repository": ID,
            "url": {"type": "string"},
            "pinned_by": {"type": "string"},
            "pinned_at": TIME,
        }
    ),
    "PinRequest": {
        "type": "object",
        "required": ["repositories"],
        "additionalProperties": False,
        "properties": {
            "repositories": {"type": "array", "items": ID, "minItems": 1, "maxItems": 100}
        },
    },
    "RolloutPins": _obj(
        {
            "rollout": ID,
            "pinned": {"type": "array", "items": ID},
            "pins": {"type": "array", "items": _ref("Pin")},
        }
    ),
    "Rollouts": _obj({"rollouts": {"type": "array", "items": _ref("Rollout")}}),
    "RolloutStarted": _obj({"id": ID, "state": {"type": "string"}, "rollout": _ref("Rollout")}),
    "RolloutSpec": {
        "type": "object",
        # a configuration of the web's code, or a known version (a code rollout:
        # docs/rollouts.md#code-rollouts-bluegreen)
        "oneOf": [{"required": ["config"]}, {"required": ["version"]}],
        "additionalProperties": False,
        "properties": {
            "queue": {"const": "analysis"},
            "config": {"type": "object"},
            "version": {"type": "string", "description": "a fingerprint (4 to 64 hex digits)"},
            "steps": {"type": "array", "items": {"type": "integer"}},
            "auto": {"type": "boolean"},
            "warm_set": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "repositories": {"type": "integer", "minimum": 1},
                    "commits_per_repository": {"type": "integer", "minimum": 1},
                    "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                },
            },
            "options": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "step_pause": {"type": "number", "minimum": 0},
                    "min_samples": {"type": "number", "minimum": 0},
                    "warm_timeout": {"type": "number", "minimum": 0},
                    # docs/rollouts.md#step-deadlines and #shadow-samples
                    "step_deadline": {"type": "number", "minimum": 0},
                    "on_inconclusive": {"enum": ["pause", "fail"]},
                    "shadow_commits": {"type": "number", "minimum": 0},
                    # docs/rollouts.md#checks-and-gates
                    "checks": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
    },
    "Freeze": _obj(
        {
            "frozen": {"type": "boolean"},
            "active": {
                "oneOf": [
                    {"type": "null"},
                    _obj(
                        {
                            "window": {"type": "string"},
                            "until": TIME_OR_NULL,
                            "reason": {"type": "string"},
                            "message": {"type": "string"},
                        }
                    ),
                ]
            },
            "stop_the_line": _obj(
                {
                    "on": {"type": "boolean"},
                    "reason": {"type": "string"},
                    "actor": {"type": "string"},
                    "changed_at": TIME_OR_NULL,
                }
            ),
            "windows": {"type": "array", "items": {"type": "object"}},
        }
    ),
    "StopTheLine": {
        "type": "object",
        "required": ["on"],
        "additionalProperties": False,
        "properties": {
            "on": {"type": "boolean"},
            "reason": {
                "type": "string",
                "maxLength": 500,
                "description": "required to switch it on; no control characters but tab "
                "and newline",
            },
        },
    },
    "Reason": {
        "type": "object",
        "properties": {
            "reason": {
                "type": "string",
                "maxLength": 500,
                "description": "no control characters but tab and newline",
            },
            "force": {"type": "boolean"},
        },
    },
    "Versions": _obj(
        {
            "versions": {
                "type": "array",
                "items": _obj(
                    {
                        "fingerprint": {"type": "string"},
                        "queue": {"type": "string"},
                        "physical_queue": {"type": "string"},
                        "code_version": {"type": "string"},
                        "declared_effect": {"type": "array", "items": {"type": "string"}},
                        "config": {"type": "object"},
                        "state": {"type": "string"},
                        "ramp_percent": {"type": "integer"},
                        "workers": _obj(
                            {
                                "count": {"type": "integer"},
                                "hosts": {"type": "array", "items": {"type": "string"}},
                                "serving": {"type": "integer"},
                            }
                        ),
                        "created_at": {"type": "string"},
                    }
                ),
            }
        }
    ),
    "RetiredVersion": _obj(
        {
            "queue": {"type": "string"},
            "fingerprint": {"type": "string"},
            "state": {"const": "retired"},
        }
    ),
}

# ------------------------------------------------------------------ analytics schemas


def _rows(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


def _report(kind: str, required: dict[str, Any], **more: Any) -> dict[str, Any]:
    """An analysis report (``dashboard.analytics.report``): what every one says about
    itself, and ``required``, the tables of ``kind``."""
    return {
        **_obj(
            {
                "repository": ID,
                "name": {"type": "string"},
                "analysis": {"const": kind},
                "fingerprint": {"type": "string"},
                "window": _ref("AnalyticsWindow"),
                "parameters": _ref("AnalyticsParameters"),
                "exclude": _LENS_NAMES,
                "reproduce": {"type": "string"},
                "computed_at": TIME,
                "provenance": _ref("AnalyticsProvenance"),
                **required,
            },
            {"verification": {"oneOf": [_ref("Verification"), {"type": "null"}]}},
        ),
        **more,
    }


def _hotspot(key: str) -> dict[str, Any]:
    return _obj(
        {
            key: {"type": "string"},
            "revs": {"type": "integer", "minimum": 1},
            "churn": COUNT,
            "authors": {"type": "integer", "minimum": 1},
            "recent": COUNT,
            "earlier": COUNT,
            "trend": {"enum": ["rising", "falling", "steady"]},
        }
    )


#: The lenses a report leaves out (docs/analytics.md#lenses).
_LENS_NAMES = {"type": "array", "items": {"enum": list(analytics.LENSES)}, "uniqueItems": True}

_OWNERSHIP = {
    "revs": {"type": "integer", "minimum": 1},
    "credits": {"type": "integer", "minimum": 1},
    "authors": {"type": "integer", "minimum": 1},
    "main_dev": {"type": "string"},
    "main_dev_name": {"type": "string"},
    "main_dev_revs": {"type": "integer", "minimum": 1},
    "ownership": {"type": "number", "minimum": 0, "maximum": 1},
    "fragmentation": {"type": "number", "minimum": 0, "maximum": 1},
    "bus_factor": {"type": "integer", "minimum": 1},
    "main_dev_inactive": {"type": "boolean"},
}


def _age(key: str) -> dict[str, Any]:
    return _obj(
        {key: {"type": "string"}, "last_change_at": TIME, "age_months": COUNT,
         "revs": {"type": "integer", "minimum": 1}}
    )  # fmt: skip


_LINES = {"insertions": COUNT, "deletions": COUNT}
_AUTHOR = {
    "author": {"type": "string"},
    "name": {"type": "string"},
    "commits": {"type": "integer", "minimum": 1},
    **_LINES,
    "first_commit_at": TIME,
    "last_commit_at": TIME,
}

SCHEMAS |= {
    "AnalyticsWindow": _obj({"since": DATE_OR_NULL, "until": DATE_OR_NULL}),
    "AnalyticsParameters": _obj(
        {
            "since": DATE_OR_NULL,
            "until": DATE_OR_NULL,
            **{
                name: {"type": "integer", "minimum": lo, "maximum": hi}
                for name, (_, lo, hi) in analytics.INTEGERS.items()
            },
            "path": {"type": "string"},
            "author": {"type": "string"},
            "exclude": _LENS_NAMES,
        }
    ),
    "AnalyticsProvenance": _obj(
        {
            "fingerprint": {"type": "string"},
            "code_version": {"type": "string"},
            "config": {"type": "object"},
            "head": STR_OR_NULL,
            "branch": {"type": "string"},
            "git_version": {"type": "string"},
            "command": {"type": "string"},
            "mailmap": {"type": "string"},
            "lenses": _obj(
                {
                    "ruleset": {"type": "string"},
                    "excluded": _LENS_NAMES,
                    "attributes": {"type": "string"},
                    "bot_patterns": {"type": "array", "items": {"type": "string"}},
                    "identity_map": COUNT,
                }
            ),
            "co_authors": {"type": "string"},
        }
    ),
    "HotspotFile": _hotspot("path"),
    "HotspotDirectory": _hotspot("directory"),
    "CouplingPair": _obj(
        {
            "entity": {"type": "string"},
            "coupled": {"type": "string"},
            "degree": {"type": "integer", "minimum": 0, "maximum": 100},
            "average_revs": {"type": "integer", "minimum": 1},
            "shared_revs": {"type": "integer", "minimum": 1},
            "revs": {"type": "integer", "minimum": 1},
            "coupled_revs": {"type": "integer", "minimum": 1},
        }
    ),
    "OwnershipFile": _obj({"path": {"type": "string"}, **_OWNERSHIP}),
    "OwnershipDirectory": _obj(
        {
            "directory": {"type": "string"},
            **_OWNERSHIP,
            "by_author": {
                "type": "array",
                "items": _obj(
                    {
                        "author": {"type": "string"},
                        "name": {"type": "string"},
                        "revs": {"type": "integer", "minimum": 1},
                    }
                ),
            },
        }
    ),
    "KnowledgeAtRisk": _obj(
        {
            "inactive_days": {"type": "integer", "minimum": 1},
            "cutoff": TIME,
            "files_at_risk": COUNT,
            "authors": {
                "type": "array",
                "items": _obj(
                    {
                        "author": {"type": "string"},
                        "name": {"type": "string"},
                        "last_commit_at": TIME,
                        "files": {"type": "array", "items": {"type": "string"}},
                    }
                ),
            },
        }
    ),
    "AgeFile": _age("path"),
    "AgeDirectory": _age("directory"),
    "Author": _obj(_AUTHOR),
    "AuthorActivity": _obj(
        {
            **_AUTHOR,
            "weekly": {
                "type": "array",
                "items": _obj(
                    {
                        "week": {"type": "string", "format": "date"},
                        "commits": {"type": "integer", "minimum": 1},
                        **_LINES,
                    }
                ),
            },
            "files": {
                "type": "array",
                "items": _obj(
                    {
                        "path": {"type": "string"},
                        "revs": {"type": "integer", "minimum": 1},
                        "added": COUNT,
                        "deleted": COUNT,
                    }
                ),
            },
            "languages": {
                "type": "array",
                "items": _obj(
                    {
                        "language": {"type": "string", "minLength": 1},
                        "changes": {"type": "integer", "minimum": 1},
                        "lines": COUNT,
                    }
                ),
            },
        }
    ),
    "FileHistory": _obj(
        {
            "path": {"type": "string"},
            "revs": {"type": "integer", "minimum": 1},
            "added": COUNT,
            "deleted": COUNT,
            "authors": {
                "type": "array",
                "items": _obj(
                    {
                        "author": {"type": "string"},
                        "name": {"type": "string"},
                        "revs": {"type": "integer", "minimum": 1},
                        "added": COUNT,
                        "deleted": COUNT,
                    }
                ),
            },
            "commits": {
                "type": "array",
                "items": _obj(
                    {
                        "sha": {"type": "string", "pattern": "^[0-9a-f]{40}$"},
                        "committed_at": TIME,
                        "author": {"type": "string"},
                        "name": {"type": "string"},
                        "subject": {"type": "string"},
                        "added": COUNT,
                        "deleted": COUNT,
                        "binary": {"type": "boolean"},
                    }
                ),
            },
            "coupled": _rows("CouplingPair"),
        }
    ),
    "HotspotsReport": _report(
        "hotspots", {"files": _rows("HotspotFile"), "directories": _rows("HotspotDirectory")}
    ),
    "CouplingReport": _report(
        "coupling",
        {},
        description="The coupled pairs of files and of directories; with ?path=P, the "
        "files coupled to P instead.",
        oneOf=[
            _obj({"files": _rows("CouplingPair"), "directories": _rows("CouplingPair")}),
            _obj({"path": {"type": "string"}, "coupled": _rows("CouplingPair")}),
        ],
    ),
    "OwnershipReport": _report(
        "ownership",
        {
            "files": _rows("OwnershipFile"),
            "directories": _rows("OwnershipDirectory"),
            "knowledge_at_risk": _ref("KnowledgeAtRisk"),
        },
    ),
    "AgeReport": _report("age", {"files": _rows("AgeFile"), "directories": _rows("AgeDirectory")}),
    "AuthorsReport": _report(
        "authors",
        {},
        description="The window's authors; with ?author=E, that author's activity instead.",
        oneOf=[_obj({"authors": _rows("Author")}), _obj({"activity": _ref("AuthorActivity")})],
    ),
    "AuthorReport": _report("authors", {"activity": _ref("AuthorActivity")}),
    "FileReport": _report("files", {"history": _ref("FileHistory")}),
}

# ---------------------------------------------------------------------------- paths

_REPO = _path("repo_id", ID)
_OPERATORS = "Operations data: needs dashboard.view_jobrun."


def _int_query(name: str, description: str) -> dict[str, Any]:
    default, lo, hi = analytics.INTEGERS[name]
    schema = {"type": "integer", "minimum": lo, "maximum": hi, "default": default}
    return _query(name, schema, description)


#: The window every analysis takes (docs/analytics.md#the-window).
_WINDOW = [
    _query("since", {"type": "string", "format": "date"}, "first day (UTC) of committer dates"),
    _query("until", {"type": "string", "format": "date"}, "last day (UTC), included"),
    _query(
        "last",
        {"type": "integer", "enum": list(analytics.PRESETS)},
        "the days ending at until (default today); not with since",
    ),
    _int_query("limit", "rows per table"),
    _query(
        "exclude",
        {"type": "string", "pattern": f"^(({'|'.join(analytics.LENSES)}),?)*$"},
        "lenses to leave out, comma-separated or repeated (docs/analytics.md#lenses)",
    ),
]
_DEPTH = _int_query("depth", "directory levels of the roll-ups")
_THRESHOLDS = [
    _int_query(name, "a coupling threshold (docs/analytics.md#change-coupling)")
    for name in ("min_revs", "min_shared_revs", "min_coupling", "max_changeset_size")
]


#: A streamed text answer (docs/api.md#export): CSV or NDJSON, whose rows are not
#: validated as JSON (the tests parse them).
_STREAMED = {
    CSV: {
        "schema": {"type": "string", "description": "a header row, then the rows (empty: no row)"}
    },
    NDJSON: {"schema": {"type": "string", "description": "one JSON object per line, per row"}},
}

_EXPORT = [
    {
        **_query("what", {"enum": list(analytics.WHATS)}, "every commit, or every file change row"),
        "required": True,
    },
    _query("format", {"enum": list(analytics.FORMATS), "default": "csv"}, "csv or ndjson"),
    *(p for p in _WINDOW if p["name"] != "limit"),
]


def _export(summary: str, *parameters: dict[str, Any]) -> dict[str, Any]:
    """``GET`` of an export (docs/api.md#export): the rows streamed as CSV or NDJSON."""
    ok = {"description": "every row, streamed (Content-Disposition names the file)",
          "content": _STREAMED}  # fmt: skip
    return {
        "get": _op(
            summary + " A 409 while the results are withheld (docs/analytics.md#verification).",
            _responses({"200": ok}, "409"),
            parameters=[*parameters, *_EXPORT],
        )
    }


def _analysis(
    summary: str, report: str, tables: list[str], *parameters: dict[str, Any]
) -> dict[str, Any]:
    """``GET`` of one analysis (docs/api.md#analytics): the JSON report, or with
    ``format=csv&table=T`` (``ndjson``) one of its ``tables`` as CSV (NDJSON)."""
    ok = {
        "description": "the report (format=json), or one table of it (format=csv or ndjson)",
        "content": {JSON: {"schema": _ref(report)}, **_STREAMED},
    }
    return {
        "get": _op(
            summary + " A 409 while the results are withheld (docs/analytics.md#verification).",
            _responses({"200": ok}, "409"),
            parameters=[
                _REPO,
                *parameters,
                *_WINDOW,
                _query(
                    "format",
                    {"enum": ["json", "csv", "ndjson"], "default": "json"},
                    "json, csv or ndjson",
                ),
                _query(
                    "table",
                    {"enum": tables},
                    "with format=csv or ndjson: the table (whichever the "
                    "report has; at_risk: one row per inactive author and file)",
                ),
            ],
        )
    }


PATHS: dict[str, Any] = {
    "/api/openapi.json": {
        "get": _op(
            "This document (no authentication needed).",
            {"200": _ok({"type": "object"}, "the OpenAPI 3.1 document")},
            security=[],
        )
    },
    "/api/repos": {
        "post": _op(
            "Submit a repository (rate-limited: submissions per minute).",
            _responses(
                {
                    "200": _ok(_ref("Repository"), "submitted before: the same repository"),
                    "202": _ok(_ref("Repository"), "new: its sync is queued"),
                }
            ),
            requestBody=_body(
                _obj(
                    {"url": {"type": "string", "maxLength": 2048}},
                    {"branch": {"type": ["string", "null"], "maxLength": 255}},
                )
            ),
        )
    },
    "/api/repos/{repo_id}": {
        "get": _op(
            "A repository's status (and, with ?summary=1, its aggregates).",
            _responses({"200": _ok(_ref("Repository"), "the repository")}),
            parameters=[_REPO, _query("summary", {"enum": ["1", "true"]}, "add aggregates")],
        )
    },
    "/api/repos/{repo_id}/commits": {
        "get": _op(
            "Its analysed commits, newest first, cursor-paginated (409 while withheld).",
            _responses({"200": _ok(_ref("CommitPage"), "one page")}, "409"),
            parameters=[
                _REPO,
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
                _query("cursor", {"type": "string"}, "the previous page's next"),
                _query("files", {"enum": ["1", "true"]}, "add each commit's files"),
            ],
        )
    },
    "/api/repos/{repo_id}/commits/{sha}": {
        "get": _op(
            "One commit: the commit page's data.",
            _responses({"200": _ok(_ref("CommitDetails"), "the commit")}),
            parameters=[_REPO, _path("sha", {"type": "string"}, "a full or abbreviated sha")],
        )
    },
    "/api/repos/{repo_id}/reanalyse": {
        "post": _op(
            "Queue a new sync generation (dashboard.change_repository; audited).",
            _responses({"202": _ok(_ref("Reanalysis"), "queued")}, "409"),
            parameters=[_REPO],
        )
    },
    "/api/repos/{repo_id}/hotspots": _analysis(
        "Its most changed files and directories, with their trend.",
        "HotspotsReport",
        ["files", "directories"],
        _DEPTH,
    ),
    "/api/repos/{repo_id}/coupling": _analysis(
        "The files and directories that change together (with ?path=P: P's).",
        "CouplingReport",
        ["files", "directories", "coupled"],
        _DEPTH,
        _query("path", {"type": "string", "maxLength": 4096}, "the files coupled to this one"),
        *_THRESHOLDS,
    ),
    "/api/repos/{repo_id}/ownership": _analysis(
        "Ownership, fragmentation and bus factor per file and directory; knowledge at risk.",
        "OwnershipReport",
        ["files", "directories", "at_risk"],
        _DEPTH,
        _int_query("inactive_days", "an author with no commit in these days is inactive"),
    ),
    "/api/repos/{repo_id}/age": _analysis(
        "Months since each file's and directory's last change.",
        "AgeReport",
        ["files", "directories"],
        _DEPTH,
    ),
    "/api/repos/{repo_id}/authors": _analysis(
        "Its authors with their commits and lines (with ?author=E: E's activity).",
        "AuthorsReport",
        ["authors", "weekly", "files", "languages"],
        _query("author", {"type": "string", "maxLength": 512}, "one author's (mailmap) e-mail"),
    ),
    "/api/repos/{repo_id}/authors/{identity}": _analysis(
        "One author's activity per week, files and languages (404: no commit in the window).",
        "AuthorReport",
        ["weekly", "files", "languages"],
        _path("identity", {"type": "string", "maxLength": 512}, "the (mailmap) e-mail"),
    ),
    "/api/repos/{repo_id}/files": _analysis(
        "One file's history, authors and coupled files (404: no change in the window).",
        "FileReport",
        ["authors", "commits", "coupled"],
        {
            **_query("path", {"type": "string", "minLength": 1, "maxLength": 4096}, "the file"),
            "required": True,
        },
        *_THRESHOLDS,
    ),
    "/api/repos/{repo_id}/export": _export(
        "Every stored commit or file change row of the head, streamed as CSV or NDJSON.",
        _REPO,
    ),
    "/api/export": _export(
        "The export of several repositories (404 for an unknown one, before any row).",
        {
            **_query(
                "repos",
                {"type": "string", "pattern": r"^[0-9]+(,[0-9]+)*$", "maxLength": 2100},
                f"repository ids, comma-separated (at most {analytics.MAX_REPOSITORIES})",
            ),
            "required": True,
        },
    ),
    "/api/repos/{repo_id}/cancel": {
        "post": _op(
            "Cancel the repository's analysis (dashboard.change_repository; audited).",
            _responses({"200": _ok(_ref("Cancelled"), "what was cancelled")}),
            parameters=[_REPO],
        )
    },
    "/api/repos/{repo_id}/hook-secret": {
        "post": _op(
            "Issue the repository's push webhook secret, shown once "
            "(dashboard.change_repository; audited).",
            _responses({"200": _ok(_ref("HookSecret"), "the new secret")}),
            parameters=[_REPO],
        )
    },
    "/api/hooks/push/{repo_id}": {
        "post": _op(
            "A git host's push (GitHub, GitLab, Gitea or generic), signed with the "
            "repository's secret instead of a session or token.",
            _responses({"202": _ok(_ref("PushAccepted"), "verified: scheduled or ignored")}),
            parameters=[_REPO],
            requestBody=_body({"type": "object"}),
            security=[],
        )
    },
    "/api/status": {
        "get": _op(
            "Locks, queues, workers, dead letters, Redis nodes. " + _OPERATORS,
            _responses({"200": _ok(_ref("Status"), "the snapshot")}),
        )
    },
    "/api/locks/release": {
        "post": _op(
            "Force-release a lock (staff + dashboard.force_release_lock; audited).",
            _responses({"200": _ok(_ref("LockRelease"), "released (or nothing held)")}),
            requestBody=_body(_obj({"key": {"type": "string", "maxLength": 255}})),
        )
    },
    "/api/queues/pause": {
        "post": _op(
            "Stop feeding a queue to workers (staff + dashboard.pause_queue; audited).",
            _responses({"200": _ok(_ref("QueueChange"), "paused")}),
            requestBody=_body(_obj({"queue": {"type": "string"}})),
        )
    },
    "/api/queues/resume": {
        "post": _op(
            "Feed a paused queue again (staff + dashboard.pause_queue; audited).",
            _responses({"200": _ok(_ref("QueueChange"), "resumed")}),
            requestBody=_body(_obj({"queue": {"type": "string"}})),
        )
    },
    "/api/runs": {
        "get": _op(
            "Search job runs, newest first, keyset-paginated. " + _OPERATORS,
            _responses({"200": _ok(_ref("RunPage"), "one page")}),
            parameters=[
                _query("state", {"type": "string"}, "a run state"),
                _query("kind", {"type": "string"}, "a run kind"),
                _query("repo", ID, "a repository id"),
                _query("q", {"type": "string"}, "text in job id, cause, error or URL"),
                _query("limit", {"type": "integer"}, "page size (clamped to 1–200)"),
                _query("before", ID, "the previous page's next"),
            ],
        )
    },
    "/api/runs/{run_id}": {
        "get": _op(
            "One run with every attempt and its trace. " + _OPERATORS,
            _responses({"200": _ok(_ref("RunTrace"), "the run")}),
            parameters=[_path("run_id", ID)],
        )
    },
    "/api/runs/{run_id}/cancel": {
        "post": _op(
            "Cancel one run (dashboard.change_jobrun; audited).",
            _responses({"200": _ok(_ref("Cancelled"), "what was cancelled")}),
            parameters=[_path("run_id", ID)],
        )
    },
    "/api/runs/cancel": {
        "post": _op(
            "Cancel every run a filter selects (dashboard.change_jobrun; audited).",
            _responses({"200": _ok(_ref("Cancelled"), "what was cancelled")}),
            requestBody=_body(
                {
                    "type": "object",
                    "properties": {
                        "state": {"enum": ["queued", "failed", "running"]},
                        "queue": {"type": "string", "maxLength": 100},
                        "repo": ID,
                    },
                }
            ),
        )
    },
    "/api/rollouts": {
        "get": _op(
            "Rollouts, newest first (view_jobrun, start_rollout or rollback_rollout).",
            _responses({"200": _ok(_ref("Rollouts"), "the rollouts")}),
            parameters=[
                _query("queue", {"type": "string"}, "a logical queue"),
                _query("limit", {"type": "integer"}, "how many (clamped to 1–200)"),
            ],
        ),
        "post": _op(
            "Start a rollout (staff + dashboard.start_rollout; rate-limited; audited).",
            _responses({"202": _ok(_ref("RolloutStarted"), "pending its driver")}, "409"),
            requestBody=_body(_ref("RolloutSpec")),
        ),
    },
    "/api/rollouts/freeze": {
        "get": _op(
            "The freeze in force, stop-the-line and the declared windows "
            "(view_jobrun, start_rollout or rollback_rollout).",
            _responses({"200": _ok(_ref("Freeze"), "the freeze state")}),
        ),
        "post": _op(
            "Switch stop-the-line on or off (staff + dashboard.rollback_rollout; audited).",
            _responses({"200": _ok(_ref("Freeze"), "the freeze state after the switch")}),
            requestBody=_body(_ref("StopTheLine")),
        ),
    },
    "/api/rollouts/{rollout_id}": {
        "get": _op(
            "One rollout with its timeline.",
            _responses({"200": _ok(_ref("Rollout"), "the rollout")}),
            parameters=[_path("rollout_id", ID)],
        )
    },
    "/api/rollouts/{rollout_id}/pin": {
        "post": _op(
            "Pin repositories to the rollout's ramping version (staff + start_rollout; audited).",
            _responses({"200": _ok(_ref("RolloutPins"), "the rollout's pins")}, "409"),
            parameters=[_path("rollout_id", ID)],
            requestBody=_body(_ref("PinRequest")),
        )
    },
    "/api/rollouts/{rollout_id}/unpin": {
        "post": _op(
            "Unpin repositories from the rollout's ramping version (staff + start_rollout).",
            _responses({"200": _ok(_ref("RolloutPins"), "the rollout's pins")}, "409"),
            parameters=[_path("rollout_id", ID)],
            requestBody=_body(_ref("PinRequest")),
        )
    },
    "/api/rollouts/{rollout_id}/{action}": {
        "post": _op(
            "Promote, roll back, abort or take over a rollout (audited).",
            _responses(
                {
                    "200": _ok(_ref("Rollout"), "done here"),
                    "202": _ok(_ref("Rollout"), "asked of its driver"),
                },
                "409",
            ),
            parameters=[
                _path("rollout_id", ID),
                _path("action", {"enum": ["promote", "rollback", "abort", "takeover"]}),
            ],
            requestBody=_body(_ref("Reason")),
        )
    },
    "/api/versions": {
        "get": _op(
            "Every analyzer version with its code version, configuration, state and live "
            "workers (view_jobrun, start_rollout or rollback_rollout).",
            _responses({"200": _ok(_ref("Versions"), "the versions, oldest first")}),
        )
    },
    "/api/versions/{fingerprint}/retire": {
        "post": _op(
            "Retire a registered, drained or warm-failed version "
            "(staff + rollback_rollout; audited).",
            _responses({"200": _ok(_ref("RetiredVersion"), "retired")}, "409"),
            parameters=[_path("fingerprint", {"type": "string"}, "4 to 64 hex digits")],
            requestBody=_body(_ref("Reason")),
        )
    },
    "/api/integrity": {
        "get": _op(
            "The integrity group: open verification mismatches. " + _OPERATORS,
            _responses({"200": _ok(_ref("IntegrityGroup"), "the open mismatches")}),
        )
    },
    "/api/integrity/{verification_id}/clear": {
        "post": _op(
            "Clear an open mismatch and serve its results again "
            "(dashboard.change_repository; audited).",
            _responses({"200": _ok(_ref("IntegrityCleared"), "cleared")}, "409"),
            parameters=[_path("verification_id", ID)],
            requestBody=_body(_ref("Reason")),
        )
    },
    "/api/dlq": {
        "get": _op(
            "Dead letters grouped by root cause. " + _OPERATORS,
            _responses({"200": _ok(_ref("DeadLetters"), "the groups")}),
        )
    },
    "/api/dlq/retry": {
        "post": _op(
            "Re-queue dead runs (dashboard.retry_jobrun; audited).",
            _responses(
                {
                    "200": _ok(_ref("Moved"), "named runs, at once"),
                    "202": _ok(_ref("BulkAction"), "a group or all: a tracked bulk action"),
                }
            ),
            requestBody=_body(_ref("DeadLetterAction")),
        )
    },
    "/api/dlq/discard": {
        "post": _op(
            "Discard dead runs (dashboard.discard_jobrun; audited).",
            _responses(
                {
                    "200": _ok(_ref("Moved"), "named runs, at once"),
                    "202": _ok(_ref("BulkAction"), "a group or all: a tracked bulk action"),
                }
            ),
            requestBody=_body(_ref("DeadLetterAction")),
        )
    },
    "/api/dlq/{group}": {
        "get": _op(
            "One group's runs with their attempts. " + _OPERATORS,
            _responses({"200": _ok(_ref("DeadLetterRuns"), "the runs")}),
            parameters=[
                _path("group", {"type": "string"}),
                _query("limit", {"type": "integer"}, "how many (clamped to 1–500)"),
            ],
        )
    },
    "/api/actions/{action_id}": {
        "get": _op(
            "A bulk action's progress. " + _OPERATORS,
            _responses({"200": _ok(_ref("BulkAction"), "the action")}),
            parameters=[_path("action_id", ID)],
        )
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "gitward JSON API",
        "version": "1",
        "description": 'docs/api.md. Errors are JSON {"error": message} with a 4xx '
        "(a 5xx only when a server it needs is down); limits: docs/api.md#limits.",
    },
    "servers": [{"url": "/"}],
    "security": [{"bearer": []}, {"session": []}],
    "components": {
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "a token from `manage.py api_token USER`",
            },
            "session": {
                "type": "apiKey",
                "in": "cookie",
                "name": "sessionid",
                "description": "the browser's session; writes need the CSRF token too",
            },
        },
        "schemas": SCHEMAS,
    },
    "paths": PATHS,
}


def openapi_document(request: HttpRequest) -> HttpResponse:
    """``GET /api/openapi.json``: ``DOCUMENT``, to anyone (it holds no data)."""
    if request.method not in {"GET", "HEAD"}:
        response = error(f"method {request.method} not allowed", 405)
        response["Allow"] = "GET, HEAD"
        return response
    return JsonResponse(DOCUMENT)
