"""The `gpumux` command line: talks to the daemon over HTTP; gpumux.main gives it the daemon
it may start (an embedded one, or `gpumux serve`)."""
