#!/usr/bin/env python
"""Django's command-line utility for gitward."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A bad setting is the operator's input, not a bug: one line naming the variable
        # and the expected form, exit 1 (``--traceback`` still shows where it came from).
        if "--traceback" in sys.argv:
            raise
        sys.stderr.write(f"gitward: configuration error: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
