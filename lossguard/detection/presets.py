"""The rule sets shipped inside the package, by name (`--rules olmo-core`). Only the package's data
is touched here, not the rules machinery (polars): the CLI lists the names in `scan --help`."""

from __future__ import annotations

from importlib import resources


def preset_names() -> list[str]:
    folder = resources.files("lossguard").joinpath("data/presets")
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    return resources.files("lossguard").joinpath(f"data/presets/{name}.toml").read_text("utf-8")
