"""``GET /api/integrity`` and ``POST /api/integrity/<id>/clear`` (dashboard/api/integrity.py):
operators only for the listing, ``dashboard.change_repository`` (staff) for the clear,
whose refusal is audited; an id with no open mismatch is a 409."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.models import ApiToken, AuditEntry, Repository, Verification

pytestmark = pytest.mark.django_db


def _client(user: User) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(user)[1]}")


def test_listing_and_clearing_need_their_permissions() -> None:
    repo = Repository.objects.create(url="https://example.com/i/r.git")
    mismatch = [{"sha": "a" * 40, "path": "x.py", "field": "added", "git": 1, "stored": 2}]
    ver = Verification.objects.create(
        repository=repo, fingerprint="f" * 16, state="mismatch", mismatch_count=1,
        mismatches=mismatch, withheld=True,
    )  # fmt: skip
    nobody = _client(User.objects.create_user("nobody", password="pw-nobody-123456"))
    assert nobody.get("/api/integrity").status_code == 403
    assert nobody.post(f"/api/integrity/{ver.pk}/clear").status_code == 403
    assert AuditEntry.objects.get(action="integrity.clear").outcome == "refused: permission denied"
    root = _client(User.objects.create_superuser("root", password="pw-root-123456"))
    listed = root.get("/api/integrity").json()
    assert listed["open"] == 1 and listed["mismatches"][0]["details"] == mismatch
    assert root.post("/api/integrity/999999/clear").status_code == 409
    assert root.post(f"/api/integrity/{ver.pk}/clear").json() == {"cleared": True, "id": ver.pk}
    ver.refresh_from_db()
    assert (ver.state, ver.withheld, ver.cleared_by) == ("cleared", False, "root")
    assert root.get("/api/integrity").json() == {"open": 0, "mismatches": []}
