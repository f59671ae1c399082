"""`python -m lossguard`: the same command as `lossguard`."""

import sys

from .cli import main

sys.exit(main())
