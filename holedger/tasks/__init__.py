"""holedger.tasks."""
