"""Shared foundations every subsystem may import: the sample and its packing, staleness, lineage,
the registries, input errors, jsonl reading, the build cache. Imports nothing else of drmas."""
