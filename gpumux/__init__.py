"""gpumux: pack the trials of a hyper-parameter sweep onto every device of a host.

This module stays free of imports: trial processes import `gpumux.runtime` through it.
"""

__version__ = "0.1.0"
