"""``python -m dashboard`` runs ``gpuscope-dashboard``."""

import sys

from dashboard.cli import main

sys.exit(main())
