"""lossguard: find loss spikes in ML training logs and say why they happened.

In a notebook::

    import lossguard
    df = lossguard.read("runs/")                     # the canonical long table (polars)
    report = lossguard.scan("runs/", rules="olmo-core")
    report.summary, report.spikes()                 # the JSON report's fields; spikes as a DataFrame
    lossguard.detect(df, rules="rules/default.toml")

The three are loaded on first use, so `import lossguard` (and the CLI's start-up) stays light.
"""

from __future__ import annotations

from .version import __version__

__all__ = ["LossguardError", "LossguardWarning", "Report", "__version__", "detect", "read", "scan"]

_API = {"read", "scan", "detect", "Report", "LossguardWarning"}


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: the API is imported when first asked for
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "LossguardError":
        from .errors import LossguardError

        return LossguardError
    raise AttributeError(f"module 'lossguard' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
