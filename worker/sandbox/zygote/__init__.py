"""The zygote's side, in the fork server (torch imported, never a secret): the server, its
spares and their warm-up, the round-trip loader, and the toolchain broker with its
command templates.
"""
