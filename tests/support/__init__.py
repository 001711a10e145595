"""Helpers the tests share: fixtures (loaded as plugins by tests/conftest.py), servers and
proxies, the simulation's world, and the fault campaign's library that bench/faults.py runs."""
