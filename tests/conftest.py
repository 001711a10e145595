"""Shared fixtures. Real components only: moto's HTTP server, a real ZooKeeper, real processes.

Fixture modules live beside this file, one per component, and are loaded as plugins.
"""

pytest_plugins = ["fixtures_s3", "fixtures_zookeeper", "fixtures_engine", "fixtures_spark", "fixtures_nodes"]
