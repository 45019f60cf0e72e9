"""``python -m gpuscope.exporter`` is ``gpuscope-exporter``."""

import sys

from gpuscope.exporter.cli import main

sys.exit(main())
