"""spark_bridge: the long-lived SparkSession, the flush of sealed Arrow blocks into ClickHouse
with deterministic, deduplicated Spark tasks, and the ``hakafka_clickhouse`` Spark data source.

Import names from their modules: `runtime` (`SparkRuntime`, `SparkSettings`,
`prepare_session`), `flush` (`flush`, `flush_block`, `FlushTarget`), `reader` (`read_table`),
`datasource`, `handoff`, `plan`, `transform`. The package imports none of them, so `runtime`,
`handoff`, `plan`, `transform`, `source_options`, `jvm_output` and `redact` load no pyspark;
`datasource`, `source_reader`, `flush`, `reader` and `worker_daemon` do. The ClickHouse code
they build on (tables, connections, replicas, clusters) is `chlib`.
"""
