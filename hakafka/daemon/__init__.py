"""`hakafka run`: the daemon process of one node.

`node.py` is the process (`Daemon`: query services, ZooKeeper registration, signals, the
systemd watchdog, shutdown within `SHUTDOWN_BOUND_S`); `shard.py` runs this node's candidacy
in one shard and, while it leads, the shard's pipelines (`ShardRunner`); `wiring.py` builds
each term's pipelines with their real parts; `report.py` is the node's view of itself that
`/status` returns. Only `hakafka run` imports this package: it
loads Spark; the operator commands (`hakafka.ops`) never do.
"""

from hakafka.daemon.node import SHUTDOWN_BOUND_S, Daemon, StartupError

__all__ = ["SHUTDOWN_BOUND_S", "Daemon", "StartupError"]
