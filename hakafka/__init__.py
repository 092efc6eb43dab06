"""hakafka: a high-availability Kafka -> ClickHouse ingestion daemon.

How the packages fit together, the exactly-once invariants, the ZooKeeper layout and the
daemon's threads: docs/DESIGN.md.
"""

__version__ = "0.1.0"
