"""W&B sweep files: a Weights & Biases sweep configuration (YAML or JSON) as a gpumux sweep.

What maps: `method` (grid, random, bayes -> tpe), `metric` -> the objective, `parameters`
(value, values, min/max, the uniform and log-uniform distributions and their q_* forms -> the
sweep grammar's tokens), `early_terminate` (hyperband -> Optuna's HyperbandPruner), `run_cap`
-> the budget, `program` and `command` with W&B's macros -> the trial's command. Metadata that
changes nothing that runs (project, entity, description, controller) is accepted with a note;
every other key gpumux cannot honour is refused with its name and what to do.

`gpumux sweep --config FILE` reads the file (`read`) and puts the command line over it
(`resolve`): options override the file's keys, PARAM tokens replace the file's parameter of the
same name or add one, and a COMMAND after `--` replaces the file's program and command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumux.grammar import sweepspec
from gpumux.grammar.sweepfile.loading import SweepFileError
from gpumux.grammar.sweepfile.reader import SweepFile, parse, read
from gpumux.grammar.sweepplan import Objective
from gpumux.status import SearchMethod

__all__ = ["Resolved", "SweepFile", "SweepFileError", "parse", "read", "resolve"]

# The searches that draw a number of trials rather than run a whole grid.
BUDGETED = frozenset(SearchMethod) - {SearchMethod.grid}
GRID_OVER_RANGE = (
    "method: grid cannot list a continuous range (W&B refuses it too); give its points with "
    "values: [...], or use method: random or bayes with run_cap"
)


@dataclass(frozen=True)
class Resolved:
    """The file with the command line over it: the fields of the SweepCreate to submit."""

    params: list[str]
    command: list[str]
    search: str | None
    trials: int | None
    objective: Objective | None
    prune: str | None
    name: str | None


def resolve(
    sweep_file: SweepFile,
    *,
    tokens: Sequence[str],
    command: Sequence[str] | None,
    search: str | None,
    trials: int | None,
    objective: Objective | None,
    prune: str | None,
    name: str | None,
) -> Resolved:
    """The sweep to submit; SweepFileError where the two together cannot run."""
    file = sweep_file.file
    # The file's tokens were parsed as it was read; the command line's are parsed here, once.
    given = sweepspec.parse_tokens(tokens)
    params = sweep_file.params | given
    texts = [token.text for token in params.values()]
    try:
        sweepspec.check_sizes(texts)
    except sweepspec.SpecError as error:
        raise SweepFileError(file, "parameters", str(error)) from error
    argv = list(command) if command else sweep_file.argv(list(params))
    if not argv:
        fix = "add program: train.py (or command:) to the file, or give COMMAND after --"
        raise SweepFileError(file, "program", f"nothing to run; {fix}")
    method = search or sweep_file.search
    # --search may carry the sampler's options (tpe:n_startup_trials=4): the method is its name.
    kind = method.partition(":")[0].strip().lower() if method else None
    budget = trials if trials is not None else sweep_file.trials
    if trials is None and budget is not None and kind == SearchMethod.grid:
        size = sweepspec.grid_size([token.param for token in params.values()])
        if size > budget:
            fix = "raise or remove run_cap, or use method: random"
            raise SweepFileError(
                file, "run_cap", f"the grid has {sweepspec.describe_count(size)} points; {fix}"
            )
        budget = None  # the cap holds: the whole grid fits in it
    if kind in BUDGETED and budget is None:
        fix = "add run_cap: K to the file, or --trials K"
        raise SweepFileError(file, "run_cap", f"a {kind} search needs a budget; {fix}")
    ranges = sorted(sweep_file.continuous - given.keys())
    if ranges and (kind == SearchMethod.grid or (kind is None and budget is None)):
        raise SweepFileError(file, f"parameters.{ranges[0]}", GRID_OVER_RANGE)
    if prune is None and sweep_file.prune is not None and not (objective or sweep_file.objective):
        fix = "add metric: {name: val_loss, goal: minimize}, or --objective val_loss:min"
        raise SweepFileError(file, "early_terminate", f"stopping compares a metric; {fix}")
    return Resolved(
        params=texts,
        command=argv,
        search=method,
        trials=budget,
        objective=objective or sweep_file.objective,
        prune=prune or sweep_file.prune,
        name=name or sweep_file.name,
    )
