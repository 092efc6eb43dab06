"""Helpers the test modules share, one copy of each: waiting, rows landed in ClickHouse,
a daemon's log events and metrics, configs, Spark blocks. A test module takes what it shares
from here (or from a conftest fixture), never from another test module:
tests/test_package_boundaries.py checks it."""
