"""holedger: the trusted layer and signed audit ledger of harness-optimization runs."""

__version__ = "0.1.0"
