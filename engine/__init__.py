"""The coordinator: relations, appends, frontiers, snapshots, restart recovery."""
