"""The split search: how many trials at once each device runs best, for each workload."""
