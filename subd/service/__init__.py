"""The daemon as a service: the daemon, its channels and their supervisor, signals, systemd notify,
health, metrics and logs.

May import: every folder below it (server, pipeline, sources, workers, recognise, punct, layout,
sinks) and the top-level modules. Nothing imports ``subd.service`` except the commands.
"""
