"""``python -m gpuscope.dashboard`` runs ``gpuscope-dashboard``."""

import sys

from gpuscope.dashboard.cli import main

sys.exit(main())
