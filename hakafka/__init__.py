"""hakafka: a high-availability Kafka -> ClickHouse ingestion daemon.

How the packages fit together, the exactly-once invariants, the ZooKeeper layout and the
daemon's threads: docs/DESIGN.md.
"""

from importlib.metadata import version

# Declared once, in pyproject.toml; `hakafka --version`, /status and hakafka_build_info show it.
__version__ = version("hakafka")
