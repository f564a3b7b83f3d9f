"""`gpumux show --trial TRIAL`: one trial whole, its parameters exact and its reason in full."""

from __future__ import annotations

from rich.table import Table

from gpumux.cli import glance, render
from gpumux.grammar import sweepspec
from gpumux.grammar.sweepplan import Objective
from gpumux.schemas.trials import TrialPublic
from gpumux.status import FINAL_TRIAL_STATUSES, PruneNote, TrialStatus


def reason_in_full(trial: TrialPublic) -> str:
    """Why the trial ended, every line of it; a pruner's note with its steps counted from 1."""
    note = PruneNote.parse(trial.error)
    if note is not None:
        return render.visible(
            f"pruned at step {note.step + 1} by the {note.pruner} pruner: "
            f"{note.metric} {note.value:.6g} at that step"
        )
    return render.visible(trial.error or render.NONE)


def trial_summary(trial: TrialPublic, objective: Objective | None) -> Table:
    """A trial's facts as label: value lines, each parameter exactly as its command got it."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    slot = glance.slot_text(trial) + (f" (N={trial.split})" if trial.split else "")
    rows = [
        ("trial", f"{trial.id} (sweep {trial.sweep_id}, attempt {trial.attempt})"),
        ("status", str(trial.status)),
        ("params", "" if trial.params else render.NONE),
        *(
            (f"  {render.visible(name)}", render.visible(sweepspec.format_value(value)))
            for name, value in trial.params.items()
        ),
        ("step", f"{glance.step_text(trial.step)} (the last it reported, counted from 1)"),
        ("slot", slot),
        ("started", render.local_time(trial.started_at)),
        ("time", render.duration(render.trial_seconds(trial))),
        ("samples/s", render.rate(trial.samples_per_s)),
    ]
    header = render.objective_header(objective)
    if header is not None:
        value = render.NONE if trial.objective is None else repr(trial.objective)
        rows.append((render.visible(header), value))
    if trial.status in FINAL_TRIAL_STATUSES and trial.status != TrialStatus.succeeded:
        rows.append(("reason", reason_in_full(trial)))
    if trial.reports_dropped:
        rows.append(("reports dropped", f"{trial.reports_dropped:,}"))
    rows.append(("log", f"gpumux logs {trial.id}"))
    for label, value in rows:
        grid.add_row(label, value)
    return grid
