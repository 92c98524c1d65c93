"""holedger.replay."""
