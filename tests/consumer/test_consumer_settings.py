"""Pure pieces of the consumer: secret redaction, offset-reset accounting, metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from hakafka.consumer import ConsumerMetrics, OffsetReset, redact_settings


def test_secret_settings_are_redacted_and_others_kept() -> None:
    settings = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ingest",
        "sasl.password": "p",
        "sasl.jaas.config": "j",
        "ssl.key.password": "k",
        "ssl.key.pem": "pem",
        "sasl.oauthbearer.client.secret": "s",
        "fetch.min.bytes": 1,
    }
    assert redact_settings(settings) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ingest",
        "sasl.password": "***",
        "sasl.jaas.config": "***",
        "ssl.key.password": "***",
        "ssl.key.pem": "***",
        "sasl.oauthbearer.client.secret": "***",
        "fetch.min.bytes": 1,
    }


def test_offset_reset_counts_only_offsets_never_read() -> None:
    assert OffsetReset("t", 0, requested=100, reset_to=250, high_watermark=900).skipped == 150
    assert OffsetReset("t", 0, requested=950, reset_to=0, high_watermark=900).skipped == 0


def test_metrics_live_on_the_given_registry() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics.create(registry)
    count = metrics.resets_of("orders", 1)
    count(OffsetReset("t", 3, requested=10, reset_to=40, high_watermark=50))
    count(OffsetReset("t", 3, requested=45, reset_to=47, high_watermark=50))
    labels = {"pipeline": "orders", "shard": "1", "partition": "3"}
    assert registry.get_sample_value("hakafka_consumer_skipped_offsets_total", labels) == 32
    assert registry.get_sample_value("hakafka_consumer_offset_resets_total", labels) == 2
    metrics.count_bad("orders", 1, "skip", 3)
    sample = registry.get_sample_value(
        "hakafka_decode_bad_messages_total", {"pipeline": "orders", "shard": "1", "action": "skip"}
    )
    assert sample == 3
