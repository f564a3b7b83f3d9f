"""The files gpumux keeps on the host: the data directory's layout (`layout`), the daemon's
lock files (`lockfile`) and a user's token file (`tokenfile`). Standard library only: the CLI
reads them without importing the server or the storage."""
