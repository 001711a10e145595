"""Shared fixtures. Real components only: moto's HTTP server, a real ZooKeeper, real processes.

Fixture modules live in the support package (tests/support/), one per component, and are loaded
as plugins; tests import shared helpers from there too (`from support.waiting import Progress`).
"""

pytest_plugins = ["support.fixtures_s3", "support.fixtures_zookeeper", "support.fixtures_engine", "support.fixtures_spark",
                  "support.fixtures_nodes", "support.fixtures_tls"]
