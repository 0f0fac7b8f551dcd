"""The command-line interface: `manage.py` commands (docs/cli.md). Each command is a thin
adapter that parses its arguments, calls a context, prints one line per outcome and
exits non-zero on bad input."""
