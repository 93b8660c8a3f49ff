"""Sizes in bytes as people write them: ``512MB``, ``4GB``, ``1.5GiB``."""

from __future__ import annotations

import re

from attnviz.common.errors import InputError

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b?|b)?")
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_byte_size(text: str, flag: str) -> int:
    """``4GB``, ``512MB``, ``1.5GiB``, ``1000`` -> bytes (KB/MB/GB/TB decimal, KiB/MiB/GiB/TiB binary)."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise InputError(f"{flag} {text!r} is not a size: give a number with a unit, e.g. 512MB, 4GB or 1.5GiB")
    number, unit = float(match.group(1)), match.group(2) or "b"
    factor = 1 if unit == "b" else (1024 if "i" in unit else 1000) ** _POWERS[unit[0]]
    size = int(number * factor)
    if size <= 0:
        raise InputError(f"{flag} {text!r} must be more than 0 bytes: e.g. 512MB or 4GB")
    return size
