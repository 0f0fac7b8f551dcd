"""The `manage.py` commands, one module per command (docs/cli.md)."""
