"""Portable run bundles (``.hlb``) and the commands for third-party verification.

``format.py`` the byte layout, its reader and writer; ``export.py`` a ledger's run written
as a bundle; ``verify.py`` a bundle replayed offline with the registered checks, plus
``checks.py``, what only a bundle has (its git history, keys, checkpoint notes and
witnesses); ``commands.py`` ``export`` and ``verify``, ``proof_commands.py`` proofs and
checkpoints, ``attest_commands.py`` attestations, ``cli_io.py`` what they share.
"""
