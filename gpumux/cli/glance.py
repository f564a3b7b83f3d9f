"""A trial's facts as a person reads them at a glance: steps counted from 1, parameter values
in their shortest faithful form, where it ran as a slot, why it ended in one phrase.

The API keeps the exact values and Optuna's steps from 0; only what the CLI prints changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpumux.grammar.sweepspec import format_value
from gpumux.schemas.trials import TrialPublic
from gpumux.status import PruneNote, TrialStatus

NONE = "-"
# Significant digits a float parameter is shown with at least: 0.0798 for 0.07976438287373289.
SHORT_DIGITS = 3
# A pruned trial's losing value: enough to compare it with the others at a glance.
PRUNED_DIGITS = 4
# repr's digits: enough to tell any two floats apart.
EXACT_DIGITS = 17
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with its control characters (escape sequences a trial or a command may hold)
    written as escapes, so that another user's text cannot drive this terminal."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def step_text(step: int | None) -> str:
    """A step as the user counts it: the API's step 0 is the first, shown as "1"."""
    return NONE if step is None else str(step + 1)


def steps_per_trial(trials: Iterable[TrialPublic]) -> int | None:
    """How many steps a whole trial of the sweep runs, as far as its succeeded trials agree
    (the same last step for each); None when none succeeded or they differ (the number of
    epochs swept, say)."""
    ends = {t.step for t in trials if t.status == TrialStatus.succeeded and t.step is not None}
    return ends.pop() + 1 if len(ends) == 1 else None


def short_float(value: float, digits: int) -> str:
    """`value` in `digits` significant digits; as the command got it when that is exact."""
    shown = f"{value:.{digits}g}"
    return format_value(value) if float(shown) == value else shown


def digits_to_tell_apart(value: float, others: Iterable[float]) -> int:
    """The fewest significant digits, SHORT_DIGITS or more, that tell `value` from `others`."""
    rest = {other for other in others if other != value and math.isfinite(other)}
    for digits in range(SHORT_DIGITS, EXACT_DIGITS):
        shown = f"{value:.{digits}g}"
        if all(f"{other:.{digits}g}" != shown for other in rest):
            return digits
    return EXACT_DIGITS


class ShortValues:
    """How the parameter values shown together print: each float with the fewest significant
    digits (SHORT_DIGITS or more) that tell it from the other values of its parameter; ints,
    strings and floats that are short already exactly as the command got them."""

    def __init__(self, params: Iterable[Mapping[str, Any]] = ()) -> None:
        floats: dict[str, set[float]] = {}
        for one in params:
            for name, value in one.items():
                if isinstance(value, float):
                    floats.setdefault(name, set()).add(value)
        # Rounding keeps the order, so a value that prints as another does prints as one of
        # its neighbours: each is told from those two only (all of them: N^2 for N trials).
        self.digits = {}
        for name, values in floats.items():
            ordered = sorted(v for v in values if math.isfinite(v))
            for i, value in enumerate(ordered):
                neighbours = ordered[max(0, i - 1) : i] + ordered[i + 1 : i + 2]
                self.digits[(name, value)] = digits_to_tell_apart(value, neighbours)

    @classmethod
    def of(cls, trials: Iterable[TrialPublic]) -> ShortValues:
        """For the parameters of these trials."""
        return cls(trial.params for trial in trials)

    def value(self, name: str, value: Any) -> str:
        """One parameter's value, control characters escaped."""
        if isinstance(value, float):
            return short_float(value, self.digits.get((name, value), SHORT_DIGITS))
        return visible(format_value(value))

    def params(self, params: Mapping[str, Any]) -> str:
        """ "lr=0.0798 width=128"."""
        text = " ".join(f"{visible(name)}={self.value(name, v)}" for name, v in params.items())
        return text or NONE


def slot_text(trial: TrialPublic) -> str:
    """The slot a trial runs or ran in: "cpu/2" is slot 2 of the device cpu (N trials share a
    device, each in a slot of its own: a 2-core CPU at N=4 has slots cpu/0 to cpu/3)."""
    if trial.device is None:
        return NONE
    return trial.device if trial.slot is None else f"{trial.device}/{trial.slot}"


def error_summary(error: str | None) -> str:
    """One line from a trial's error: how it ended, and the last line of its log."""
    if not error:
        return ""
    head, _, tail = visible(error).partition("\n")
    head = head.split("; last lines of its log:")[0]
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
    return f"{head}: {last}" if last else head


def pruned_phrase(note: PruneNote, steps: int | None = None) -> str:
    """ "at step 2 of 10 by asha: val_loss 0.2478": the step (from 1) whose objective lost, the
    pruner, and that value."""
    of = f" of {steps}" if steps is not None and note.step < steps else ""
    value = f"{note.value:.{PRUNED_DIGITS}g}"
    return visible(f"at step {note.step + 1}{of} by {note.pruner_name}: {note.metric} {value}")


def reason_text(trial: TrialPublic) -> str:
    """Why a trial that did not succeed ended, in one line after its status: the pruner's phrase
    ("at step 2 by asha: val_loss 0.2478"), or its error's first and last lines."""
    if trial.status == TrialStatus.succeeded:
        return ""
    note = PruneNote.parse(trial.error)
    return pruned_phrase(note) if note is not None else error_summary(trial.error)


def ended_text(trial: TrialPublic, steps: int | None, took: str) -> str:
    """A pruned trial's end in one phrase after its status, `took` its run time: "at step 2 of
    10 by asha: val_loss 0.2478 (stopped at step 7, after 4.7s)"; "" for any other trial."""
    note = PruneNote.parse(trial.error) if trial.status == TrialStatus.pruned else None
    if note is None:
        return ""
    # The pruner judges the steps a tick reads together in order: a trial that reported several
    # since the last tick is stopped at its latest, past the step that lost.
    stopped = (
        f"stopped at step {step_text(trial.step)}, "
        if trial.step is not None and trial.step > note.step
        else ""
    )
    return f"{pruned_phrase(note, steps)} ({stopped}after {took})"
