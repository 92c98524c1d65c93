"""holedger.analysis."""
