"""Bytes -> canonical rows: one small module per log format, plus sniffing (sniff.py)."""
