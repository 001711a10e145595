"""Traces: a relation's compacted Parquet batches, consolidation and the compacter."""
