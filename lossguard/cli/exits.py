"""The exit codes every command shares: 1 says "spikes found" and nothing else, so no failure may
leave with it (a usage error is 2, a bug 3, Ctrl-C 130)."""

from __future__ import annotations

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
