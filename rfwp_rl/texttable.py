"""Plain-text tables for the console: columns padded to their widest cell."""

from __future__ import annotations


def format_columns(header: list[str], rows: list[list[str]], first_left: bool = False, rule: bool = False) -> str:
    """``header`` and ``rows`` (cells already formatted) as lines of columns joined by two spaces,
    right-aligned (the first column left-aligned with ``first_left``), with a line of dashes under
    the header when ``rule``."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def join(line: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 and first_left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
        )

    out = [join(header)]
    if rule:
        out.append("  ".join("-" * w for w in widths))
    return "\n".join(out + [join(r) for r in rows])
