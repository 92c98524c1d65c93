"""Pydantic models, canonical bytes and exported JSON Schema: the contract between rooms."""
