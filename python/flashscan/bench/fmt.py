"""Numbers, rows and exceptions as short text (the log lines and the markdown cells)."""

from __future__ import annotations

from .results import Row


def first_line(exc: BaseException, limit: int = 160) -> str:
    s = str(exc).strip().splitlines()
    line = s[0] if s else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def fmt_t(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1.0:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def fmt_x(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}×"


def rate(row: Row, t: float | None) -> tuple[float | None, str]:
    """(value, unit): TFLOP/s for attention, GB/s otherwise."""
    if t is None or t <= 0:
        return None, ""
    if row.flops:
        return row.flops / t / 1e12, "TFLOP/s"
    if row.bytes:
        return row.bytes / t / 1e9, "GB/s"
    return None, ""


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def row_summary(row: Row) -> str:
    if row.status in ("skipped", "n/a", "unavailable", "error"):
        return f"{row.status}: {row.note}"
    parts = [] if row.status in ("ok", "anchor") else [row.status]
    if row.gpu_s is not None:
        v, unit = rate(row, row.gpu_s)
        parts.append(f"gpu {fmt_t(row.gpu_s)}" + (f" {fmt_rate(v)} {unit}" if v else ""))
        if row.floor_s:
            parts.append(f"{row.gpu_s / row.floor_s:.2f}x floor")
    if row.cpu_s is not None:
        parts.append(f"host {fmt_t(row.cpu_s)}")
    if row.first_call_s is not None and row.first_call_s > 0.05:
        parts.append(f"first call {fmt_t(row.first_call_s)}")
    if row.wall_s is not None:
        parts.append(f"wall/call {fmt_t(row.wall_s)}")
    if row.sync_s is not None:
        parts.append(f"call+sync {fmt_t(row.sync_s)}")
    if row.graph_s is not None:
        parts.append(f"graph {fmt_t(row.graph_s)} (wall {fmt_t(row.graph_wall_s)})")
    if row.note and row.status != "ok":
        parts.append(row.note)
    return ", ".join(parts)
