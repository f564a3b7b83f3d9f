"""The table benchmarks/hostile.py prints: one row per measure, one column per backend, and
the goals of issue 22."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

# Wide enough for the table on one line per measure, printed to a terminal or not.
console = Console(soft_wrap=True, width=120)


def shown(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def of(part: dict[str, Any] | None, done: str, out_of: str) -> str:
    if not part or part.get(done) is None:
        return "-"
    return f"{part[done]:,} of {part[out_of]:,}"


def counted(statuses: dict[str, int] | None) -> str:
    if not statuses:
        return "-"
    return ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))


def listed(values: list[Any] | None, none: str) -> str:
    """One value per node (and restart), `none` where there is none."""
    if values is None:
        return "-"
    return ", ".join(none if value is None else str(value) for value in values)


def rows_of(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(measure, value, goal) rows of one backend's figures."""
    health = figures.get("health", {})
    victims = figures.get("victims", {})
    flood = figures.get("report_flood", {})
    output = figures.get("output_flood") or {}
    left = figures.get("left", {})
    bomb = figures.get("fork_bomb", {})
    recorded = [
        "yes" if done else "no" for done in figures.get("cancel_recorded", {}).values()
    ] or None
    return [
        ("/health p99, ms", shown(health.get("p99_ms")), "< 250"),
        ("/health worst, ms", shown(health.get("worst_ms")), "< 1000"),
        (
            "/health asked (timed out)",
            f"{shown(health.get('requests'))} ({shown(health.get('timeouts'))})",
            "(0)",
        ),
        ("other user's trials succeeded", of(victims, "succeeded", "trials"), "all"),
        ("  unfinished at the deadline", shown(victims.get("unfinished")), "0"),
        ("  requeued", shown(victims.get("requeued")), "0"),
        ("  slowed past the lease", shown(victims.get("slowed_past_lease")), "0"),
        ("  worst overrun, s", shown(victims.get("worst_overrun_s")), "< lease"),
        ("  reports stored", of(victims, "reports_stored", "reports_sent"), "all"),
        ("  after the restarts", counted(figures.get("victims_at_end")), "all succeeded"),
        ("database growth, MB", shown(figures.get("db_growth_mb")), "< 10"),
        ("report flood: lines sent", shown(flood.get("lines")), ""),
        ("  recorded as", shown(flood.get("status")), "succeeded"),
        ("  sent in, s", shown(flood.get("send_s")), ""),
        ("  its end recorded after, s", shown(flood.get("end_seen_s")), ""),
        ("  reports stored", shown(flood.get("reports_stored")), ""),
        ("  steps whose last value is stored", of(flood, "steps_intact", "steps"), "all"),
        ("output flood: MB written", shown(round(output["bytes"] / 1e6) if output else None), ""),
        ("fork bomb: processes reached", of(bomb, "peak", "asked"), "its limit"),
        ("escape: processes seen", shown(figures.get("escape_processes_seen")), ""),
        ("cancel of escape and bomb recorded", listed(recorded, "-"), "yes"),
        ("left after cancel", shown(left.get("cancel")), "0"),
        ("left after restart", shown(left.get("restart")), "0"),
        ("left after kill -9 + restart", shown(left.get("kill -9")), "0"),
        ("SIGTERM to exit, s", listed(figures.get("sigterm_s"), "ignored"), "grace"),
        ("answered after restart, kill -9, s", listed(figures.get("answered_s"), "no"), "< 30"),
        ("phase 1, s", shown(figures.get("phase_s")), ""),
    ]


def print_table(results: dict[str, dict[str, Any]]) -> None:
    table = Table(title="hostile trials beside another user's")
    table.add_column("measure")
    for backend, figures in results.items():
        table.add_column(
            f"{backend} ({figures['nodes']} node{'s' * (figures['nodes'] > 1)})", justify="right"
        )
    table.add_column("goal", justify="right")
    columns = [rows_of(figures) for figures in results.values()]
    for index, (measure, _, goal) in enumerate(columns[0]):
        table.add_row(measure, *(rows[index][1] for rows in columns), goal)
    console.print(table)
    for backend, figures in results.items():
        for error in figures.get("victims", {}).get("errors", []):
            console.print(f"{backend}: other user's trial: {error}")
        for command in figures.get("left_commands", []):
            console.print(f"{backend}: left running: {command}")
        if "error" in figures:
            console.print(f"{backend}: cut short: {figures['error']}")
