"""holedger.ledger."""
