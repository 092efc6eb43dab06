"""One pipeline of one shard while this node leads it (see docs/DESIGN.md, "Pipeline").

`PipelineLeader` (leader.py) owns the lifecycle: recovery, then the consume lane
(consume.py) on its own thread and the flush lane (flush.py) on another. It is handed its
parts (parts.py: consumer, WAL, re-fetch, sink, fenced ZooKeeper state) by the daemon, so
the flush / commit / backpressure protocol is unit-tested with in-memory fakes. Beside them:
the state both lanes share (context.py), the memory buffer wrapper (buffer.py), WAL replay
bookkeeping (replay.py), the WAL record codec (walcodec.py), the Kafka re-fetch (refetch.py)
and the Spark sink (sink.py).
"""

from hakafka.pipeline.leader import PipelineLeader
from hakafka.pipeline.parts import PipelineParts
from hakafka.pipeline.state import PipelineState, PipelineStatus

__all__ = ["PipelineLeader", "PipelineParts", "PipelineState", "PipelineStatus"]
