"""`holedger demo`: a complete, offline, verified optimization run on the bundled task."""
