"""Chaos for a local hakafka cluster: `driver` applies a seeded schedule of bounded faults,
`watcher` records every leader change, `liveness` samples whether data moves while the
nodes say they are ready, `checks` reads the daemons' logs and WALs at the end of a run, and
`netns` runs a daemon in a network namespace of its own that a fault partitions."""
