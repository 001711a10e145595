"""The write-ahead log: checksummed records in file segments or a device ring."""
