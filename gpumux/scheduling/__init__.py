"""The daemon's loop: which queued trial runs where, launching, recording ends."""
