"""holedger.server."""
