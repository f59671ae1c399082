"""`python -m lossguard.cli`: the same command as `lossguard` (the README's staged install runs it)."""

import sys

from . import main

sys.exit(main())
