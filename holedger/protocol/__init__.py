"""The protocol's pure rules, shared by the writer (to decide) and replay (to check).

Nothing here does I/O or imports another room than ``schemas/`` (and the error types):
the server, the gateway and replay all import these modules, never one another, for a
rule both sides apply.
"""
