"""A trial that reports loss = (x - 2)**2 + 1/(step + 1) at steps 0..4 over the report API.

x=4 reports once, without a step: it has a value but no learning curve.
"""

from __future__ import annotations

import json
import os
import urllib.request

STEPS = 5

x = float(json.loads(os.environ["GPUMUX_PARAMS"])["x"])


def report(metrics: dict[str, float], step: int | None = None) -> None:
    """POST one report of this attempt, as gpumux.runtime.report does."""
    body = {
        "trial_id": int(os.environ["GPUMUX_TRIAL_ID"]),
        "attempt": int(os.environ["GPUMUX_ATTEMPT"]),
        "kind": "manual",
        "step": step,
        "metrics": metrics,
    }
    request = urllib.request.Request(
        os.environ["GPUMUX_URL"] + "/reports",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {os.environ['GPUMUX_TRIAL_TOKEN']}",
        },
    )
    urllib.request.urlopen(request, timeout=30).close()


if x == 4:
    report({"loss": (x - 2) ** 2})
else:
    for step in range(STEPS):
        report({"loss": (x - 2) ** 2 + 1 / (step + 1)}, step)
