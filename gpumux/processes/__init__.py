"""Trial processes: the per-attempt supervisor, its run directory, the trial logs."""
