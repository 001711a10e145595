"""Spark jobs that feed the WAL and read consolidated traces."""
