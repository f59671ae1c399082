"""`python -m lossguard.cli`: the same command as `lossguard` (docs/deployment.md's staged install runs it)."""

import sys

from . import main

sys.exit(main())
