"""The HTML pages: one module per noun, named as the JSON API names its resources
(`dashboard/api/`), with the forms, list parameters, humanised numbers, charts and the
whole-page cache they share. Views are thin: they parse a request, call a context, and
render. See docs/architecture.md#layers."""

__all__ = [
    "analytics",
    "charts",
    "commits",
    "forms",
    "humanize",
    "list_params",
    "ops",
    "page_cache",
    "prerendered_rows",
    "probes",
    "repositories",
    "rollouts",
    "runs",
]
