"""holedger.sandboxes."""
