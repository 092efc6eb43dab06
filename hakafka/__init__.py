"""hakafka: a high-availability Kafka -> ClickHouse ingestion daemon."""

__version__ = "0.1.0"
