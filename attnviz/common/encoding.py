"""The one check that text is UTF-8, wherever it comes from: a file, standard input, or the command line.

Bytes are decoded strictly (never replaced or escaped): text attnviz cannot read exactly is refused
with one message, rather than analysed as something the user did not write.
"""

from __future__ import annotations

from attnviz.common.errors import InputError


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as text; :class:`InputError` naming ``what`` (``data file x.txt``, ``standard input``) if not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_utf8(text: str, what: str) -> str:
    """``text`` itself, unless it holds characters that no UTF-8 bytes encode.

    Python hands over undecodable bytes (of a command line or of standard input in the C locale) as lone
    surrogates; they are refused here like undecodable bytes are in :func:`decode_utf8`.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text: check the terminal's or the file's encoding") from None
    return text


__all__ = ["check_utf8", "decode_utf8"]
