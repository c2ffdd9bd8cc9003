"""``python -m otel_gpu`` runs the same CLI as the ``otel-gpu`` script."""

from otel_gpu.cli import main

raise SystemExit(main())
