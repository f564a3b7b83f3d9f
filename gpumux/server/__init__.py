"""The daemon: the API and the scheduler in one event loop, its sockets and identity."""
