"""What the `hakafka` operator commands do, one module per command family; `hakafka.cli` is
only the argparse layer over them."""
