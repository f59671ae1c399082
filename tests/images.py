"""PNG checks with Pillow (installed with matplotlib): the file decodes whole, and its size."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image


def png_size(png: bytes | Path) -> tuple[int, int]:
    """(width, height) of a PNG whose every pixel decodes (a truncated or damaged file raises)."""
    with Image.open(io.BytesIO(png) if isinstance(png, bytes) else png) as image:
        image.load()
        assert image.format == "PNG"
        return image.size
