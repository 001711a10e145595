"""A cluster of coordinators (issue 29): partitions assigned to live members.

This package holds the cluster's logic. :mod:`sediment.cluster.assignment` is pure (no I/O,
no clock): which member owns which partition under which generation, so the manager's
decisions can be checked exhaustively and replayed in the seeded simulation.
"""
