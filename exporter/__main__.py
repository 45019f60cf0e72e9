"""``python -m exporter`` is ``gpuscope-exporter``."""

import sys

from exporter.cli import main

sys.exit(main())
