"""What devices the host offers and, per kind of device, how a trial is capped on it."""
