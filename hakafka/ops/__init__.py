"""What the `hakafka` operator commands do, one module per command family, and `handlers`:
each command run from its parsed arguments. `hakafka.cli` is only the argparse layer over them.

They never import the daemon or the pipeline (tests/test_layering.py): they reach running
nodes through ZooKeeper and the nodes' endpoints, and build their clients from
`hakafka.settings`, so no operator command loads Spark."""
