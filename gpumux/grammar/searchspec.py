"""The `NAME:key=value,...` form of `--search` and `--prune`, read without Optuna.

The sweep request splits `--search tpe:n_startup_trials=4` into its method and options when it
is validated (the CLI checks its request with the same schema, and imports no Optuna);
`search.methods` checks each option against the constructor of the class it configures.
"""

from __future__ import annotations

import re

from gpumux.text import quoted

# A value as the request carries it: the JSON API's own types, or the text after `=`.
OptionValue = bool | int | float | str
Options = dict[str, OptionValue]

_OPTION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^,=]+)")
# The longest option text, or Optuna's message, a refusal repeats: a refusal is a line.
OPTION_CHARS = 120


class SearchError(ValueError):
    """A search or pruner the sweep cannot have; the message says why and what to do."""


def split_spec(text: str, *, flag: str, example: str) -> tuple[str, Options]:
    """`tpe:n_startup_trials=4` -> ("tpe", {"n_startup_trials": 4}): the name in lower case and
    each option's value a number where it reads as one, else its text. `flag` names the option
    in refusals (--search), `example` is an option to show (n_startup_trials=4)."""
    name, colon, rest = text.strip().partition(":")
    name = name.strip().lower()
    options: Options = {}
    if not colon:
        return name, options
    for item in rest.split(","):
        match = _OPTION.fullmatch(item.strip())
        if match is None:
            given = quoted(item.strip(), OPTION_CHARS)
            raise SearchError(f"{flag} option {given} is not NAME=VALUE; e.g. {name}:{example}")
        key, value = match.groups()
        if key in options:
            raise SearchError(f"{flag} option {key} given twice; keep one")
        options[key] = number_or_text(value.strip())
    return name, options


def spec_text(name: str, options: Options) -> str:
    """The form a spec is given in, normalised: asha:min_resource=2,reduction_factor=3."""
    if not options:
        return name
    return f"{name}:" + ",".join(f"{k}={_value_text(v)}" for k, v in options.items())


def number_or_text(text: str) -> int | float | str:
    """An option's value: an int for a whole number (1e3 too), a float, else the text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    # Neither NaN nor infinity is whole: both stay floats, and are refused as such.
    return int(number) if number.is_integer() else number


def _value_text(value: OptionValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
