"""lossguard: find loss spikes in ML training logs and say why they happened."""

from __future__ import annotations

__version__ = "0.1.0"
