"""Reliability: real daemons loaded, crashed and restarted; nothing acknowledged is lost."""
