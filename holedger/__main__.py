"""``python -m holedger``: the same command line as ``holedger``."""

from holedger.cli import main

main()
