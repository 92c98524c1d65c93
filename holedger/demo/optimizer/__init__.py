"""The example optimizer (a standalone, standard-library-only program: optimizer.py)."""
