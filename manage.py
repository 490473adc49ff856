#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_service.settings")
    if sys.argv[1:2] == ["run_engine_worker"]:
        # The engine process loads its model while this one sets Django up (api/worker/early_engine.py).
        from api.worker.early_engine import spawn_engine

        spawn_engine(sys.argv[2:])
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
