from __future__ import annotations

from typing import Any

from django import forms

from dashboard.repositories import validate_remote
from workers.remotes import InvalidRemote, normalise_branch


class SubmitRepositoryForm(forms.Form):
    url = forms.CharField(
        label="Repository URL",
        max_length=2048,
        widget=forms.TextInput(attrs={"placeholder": "https://github.com/owner/repo.git"}),
    )
    branch = forms.CharField(
        label="Branch",
        max_length=255,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "default branch"}),
    )

    def clean_url(self) -> str:
        raw = self.cleaned_data["url"]
        try:
            validate_remote(raw)
        except InvalidRemote as exc:
            raise forms.ValidationError(str(exc)) from None
        return str(raw).strip()

    def clean_branch(self) -> str:
        raw = self.cleaned_data.get("branch") or ""
        try:
            return normalise_branch(raw)
        except InvalidRemote as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        return super().clean() or {}
