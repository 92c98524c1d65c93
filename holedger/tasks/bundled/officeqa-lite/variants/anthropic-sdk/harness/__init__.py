"""The officeqa-lite seed harness (run as ``python3 -m harness``)."""
