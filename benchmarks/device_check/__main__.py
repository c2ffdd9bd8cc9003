"""``python -m benchmarks.device_check``: see :mod:`benchmarks.device_check.cli`."""

from benchmarks.device_check.cli import main

raise SystemExit(main())
