"""holedger.gateway."""
