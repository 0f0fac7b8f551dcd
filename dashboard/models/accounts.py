"""Who did what: the audit trail and API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


class AuditEntry(models.Model):
    """Who did what to what, when, and how it ended."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64, db_index=True)
    target = models.CharField(max_length=500)
    outcome = models.CharField(max_length=500)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"


class ApiToken(models.Model):
    """A bearer token for the JSON API; only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def issue(cls, user: object) -> tuple[ApiToken, str]:
        raw = "gw_" + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, digest=cls.hash(raw), prefix=raw[:10])
        return token, raw
