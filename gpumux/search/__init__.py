"""Adaptive search: Optuna's samplers choose a sweep's next trials, its pruners stop the losers.

`space` maps the sweep grammar to Optuna's distributions and `methods` names the samplers and
pruners a sweep may use (the API and the CLI check sweeps with them, the CLI exports with
them); `studies` keeps one in-memory Optuna study per adaptive sweep in the daemon, rebuilt
from the database, which stays the truth. None imports Optuna at its top: only the sweeps that
use it do (space.load_optuna).
"""
