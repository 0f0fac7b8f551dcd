from __future__ import annotations

from typing import Any

from django import forms

from dashboard.accounts import reason_problem
from dashboard.repositories import validate_remote
from dashboard.rollouts import validate_steps
from dashboard.versions import InvalidConfig, RolloutError, fingerprint_config
from workers import locks
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


def _typed_reason(value: str) -> None:
    """A reason field's validator: no control characters (``accounts.reason_problem``),
    checked before the action runs; Django's ``CharField`` already refuses a NUL."""
    problem = reason_problem(value)
    if problem is not None:
        raise forms.ValidationError(problem.replace('"reason"', "the reason"))


def _split_lines(raw: str) -> list[str]:
    return [line.strip() for line in raw.replace(",", "\n").splitlines() if line.strip()]


class StartRolloutForm(forms.Form):
    """A new analyzer configuration to roll out (docs/rollouts.md); the domain validates the
    config and the steps (``rollouts.fingerprint_config`` / ``validate_steps``) so the
    page and the CLI refuse the same things with the same words."""

    queue = forms.CharField(label="Queue", max_length=100, initial="analysis")
    #: A known version's fingerprint instead of a configuration: a code rollout of a
    #: version learned from its workers (docs/rollouts.md#code-rollouts-bluegreen).
    version = forms.CharField(label="Version", max_length=64, required=False)
    detect_renames = forms.BooleanField(label="detect_renames (like git log -M)", required=False)
    ignore_whitespace = forms.BooleanField(
        label="ignore_whitespace (like git log -w)", required=False
    )
    exclude_paths = forms.CharField(
        label="exclude_paths (glob patterns, one per line)",
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "vendor/**\n*.min.js"}),
    )
    steps = forms.CharField(label="Ramp steps (%)", max_length=100, initial="10,50,100")
    auto = forms.BooleanField(label="auto (health-checked steps)", required=False)
    reason = forms.CharField(
        label="Reason (audit log)", max_length=500, required=False, validators=[_typed_reason]
    )

    def clean_queue(self) -> str:
        raw = str(self.cleaned_data["queue"]).strip()
        try:
            locks.deploy(raw)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return raw

    def clean_steps(self) -> list[int]:
        raw = _split_lines(str(self.cleaned_data["steps"]))
        try:
            return validate_steps([int(s.rstrip("%")) for s in raw])
        except ValueError:
            raise forms.ValidationError("steps are whole percentages, e.g. 10,50,100") from None
        except RolloutError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["version"] = str(data.get("version") or "").strip() or None
        if data["version"] is not None:  # the version's own configuration
            data["config"] = None
            return data
        config = {
            "detect_renames": bool(data.get("detect_renames")),
            "ignore_whitespace": bool(data.get("ignore_whitespace")),
            "exclude_paths": _split_lines(str(data.get("exclude_paths") or "")),
        }
        try:
            fingerprint_config(config)
        except InvalidConfig as exc:
            self.add_error("exclude_paths", str(exc))
        data["config"] = config
        return data


class RolloutActionForm(forms.Form):
    """A button's confirm step: the operator's reason, and the percentage of set ramp."""

    reason = forms.CharField(
        label="Reason (audit log)", max_length=500, required=False, validators=[_typed_reason]
    )
    percent = forms.IntegerField(label="Ramp %", min_value=1, max_value=100, required=False)
    next = forms.CharField(required=False, max_length=500, widget=forms.HiddenInput)


class StopTheLineForm(forms.Form):
    """The Rollouts page's stop-the-line switch (docs/rollouts.md#freeze-windows): on or
    off, with the reason every refusal then names (required to switch it on)."""

    on = forms.TypedChoiceField(choices=[("1", "on"), ("0", "off")], coerce=lambda v: v == "1")
    reason = forms.CharField(
        label="Reason (shown with every refusal)",
        max_length=500,
        required=False,
        validators=[_typed_reason],
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("on") and not str(data.get("reason") or "").strip():
            self.add_error("reason", "Say why the line is stopped: every refusal shows it.")
        return data


class PinForm(forms.Form):
    """The Rollouts page's pin form (docs/rollouts.md#pinning): repository ids (separated by
    commas or spaces) to pin to, or unpin from, the rollout's ramping version."""

    action = forms.ChoiceField(choices=[("pin", "pin"), ("unpin", "unpin")])
    repositories = forms.CharField(label="Repository ids", max_length=2000)

    def clean_repositories(self) -> list[int]:
        raw = str(self.cleaned_data.get("repositories") or "")
        parts = [p for p in raw.replace(",", " ").split() if p]
        if not parts or not all(p.isdigit() and 0 < int(p) < 2**63 for p in parts):
            raise forms.ValidationError("Give repository ids, e.g. 12, 40.")
        if len(parts) > 100:
            raise forms.ValidationError("At most 100 repositories at a time.")
        return [int(p) for p in parts]
