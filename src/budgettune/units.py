"""Byte sizes in and out. Parsed once at the edge with `pydantic.ByteSize`."""

from __future__ import annotations

from pydantic import ByteSize, TypeAdapter, ValidationError

from budgettune.errors import UsageError

_BYTE_SIZE = TypeAdapter(ByteSize)


def parse_bytes(
    text: str | int | float,
    *,
    what: str = "size",
    min_bytes: int = 1,
    max_bytes: int | None = None,
) -> int:
    """Parse a human byte size (``20GB``, ``18.5GiB``, ``900MB``, ``12345``) into bytes.

    Decimal units (GB = 10**9) and binary units (GiB = 2**30) are both accepted, as pydantic does.

    Args:
        text: the size as typed by the user, or a number of bytes.
        what: the name of the value, used in the error message.
        min_bytes: the smallest size accepted (a bare number under it is taken for a size
            written without its unit, and told so).
        max_bytes: the largest size accepted (None: no limit).

    Returns:
        The size in bytes, within [min_bytes, max_bytes].

    Raises:
        UsageError: when the text is not a size or is out of range.
    """
    try:
        value = int(_BYTE_SIZE.validate_python(text))
    except (ValidationError, OverflowError):
        raise UsageError(
            f"{what} {text!r} is not a byte size; write it like 20GB, 18.5GiB or 900MB"
        ) from None
    if value <= 0:
        raise UsageError(f"{what} must be positive, got {text!r}")
    if value < min_bytes:
        if _is_bare_number(text):
            raise UsageError(
                f"{what} {value} bytes is certainly missing its unit (it is under the floor "
                f"of {format_bytes(min_bytes)}): write it as {value}GB or {value}MB"
            )
        raise UsageError(
            f"{what} {text} is {format_bytes(value)}, under the floor of {format_bytes(min_bytes)}"
        )
    if max_bytes is not None and value > max_bytes:
        raise UsageError(
            f"{what} {text} is more than the largest size accepted, {format_bytes(max_bytes)}"
        )
    return value


def _is_bare_number(text: str | int | float) -> bool:
    """Whether a size was written without a unit (``120``, ``"120"``, ``1.5``)."""
    if isinstance(text, (int, float)):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_bytes(num_bytes: int | float | None) -> str:
    """Render bytes as both decimal and binary units: ``15.06 GB (14.03 GiB)``."""
    if num_bytes is None:
        return "-"
    value = float(num_bytes)
    for decimal, binary, scale in (
        ("GB", "GiB", 3),
        ("MB", "MiB", 2),
        ("kB", "KiB", 1),
    ):
        if abs(value) >= 1000**scale:
            return f"{value / 1000**scale:.2f} {decimal} ({value / 1024**scale:.2f} {binary})"
    return f"{int(value)} B"


def format_gb(num_bytes: int | float | None) -> str:
    """Short decimal-GB rendering for tables: ``15.06``."""
    if num_bytes is None:
        return "-"
    return f"{float(num_bytes) / 1e9:.2f}"


def format_percent(fraction: float) -> str:
    """``0.02`` → ``2%``, ``0.005`` → ``0.5%`` (a margin, never rounded to nothing)."""
    return f"{fraction * 100:.3g}%"


def format_count(count: int | None, word: str) -> str:
    """``1 run``, ``3 runs``: a count and its noun, singular for one."""
    return f"{count} {word}{'' if count == 1 else 's'}"
