"""Markdown text of docs/RESULTS.md: number formats, and a document's sections by heading (read one, replace one:
what `--only` does to the existing document)."""

from __future__ import annotations

from collections.abc import Sequence

from silofl.server import plots


def hours(seconds: float) -> str:
    """`1.25 h` from 6 minutes on, else `4.5 min`."""
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def fmt(value: object) -> str:
    """A config value as the figures label it (`server.plots`: `1`, `0.5`, `inf`)."""
    return plots.fmt(value)


def pct(value: float | None) -> str:
    """A fraction as `48.2%`; `n/a` for None."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def mean_sd_text(values: Sequence[float]) -> str:
    """`79.1%` for one value, `79.1% ± 0.4` (sample sd) for several."""
    mean, sd = plots.mean_sd(values)
    return f"{mean:.1f}%" + (f" ± {sd:.1f}" if len(values) > 1 else "")


def mean_sd_value_text(values: Sequence[float], digits: int = 4) -> str:
    """`0.1800 ± 0.0141`: the mean and sample sd (0 for one value) of `values`, to `digits` decimals."""
    mean, sd = plots.mean_sd(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def _section_span(lines: Sequence[str], heading: str) -> tuple[int, int] | None:
    """Where the `heading` section of a document's `lines` starts and ends (up to the next heading of the same level
    or above), or None if it has none."""
    level = len(heading.split(" ", 1)[0])
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        return None

    def ends_it(line: str) -> bool:  # a heading of the same level or above
        marks = len(line) - len(line.lstrip("#"))
        return 0 < marks <= level and line[marks : marks + 1] == " "

    return start, next((i for i in range(start + 1, len(lines)) if ends_it(lines[i])), len(lines))


def section_lines(document: str, heading: str) -> list[str]:
    """The lines of `document`'s `heading` section as it stands (its subsections included; [] if it has none)."""
    lines = document.splitlines()
    span = _section_span(lines, heading)
    return lines[span[0] : span[1]] if span else []


def replace_section(document: str, heading: str, section: Sequence[str], before: str | Sequence[str]) -> str:
    """`document` with its `heading` section (up to the next heading of the same level or above) replaced by
    `section`, or with `section` inserted before the heading `before` (given several, the first of them the
    document has: the sections that follow in the document's order; at the end if it has none)."""
    text = "\n".join(section).rstrip() + "\n\n"
    lines = document.splitlines(keepends=True)
    span = _section_span(lines, heading)
    if span:
        return "".join(lines[: span[0]]) + text + "".join(lines[span[1] :])
    stripped = [line.rstrip("\n") for line in lines]
    headings = [before] if isinstance(before, str) else list(before)
    at = next((stripped.index(h) for h in headings if h in stripped), len(lines))
    return "".join(lines[:at]) + text + "".join(lines[at:])
