"""A trial that does nothing: what is left of its run time is gpumux's launch overhead."""
