"""`SharedGroupOffsets`: one Kafka client for the terms of every shard a daemon leads of one
pipeline, made for the first term and closed with the last (a fake client here)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, cast

from hakafka.consumer.group_offsets import SharedGroupOffsets


class FakeClient:
    def __init__(self, made: list[FakeClient]) -> None:
        self.commits: list[dict[int, int]] = []
        self.closed = False
        made.append(self)

    def publish(self, offsets: Mapping[int, int]) -> None:
        assert not self.closed, "published through a closed client"
        self.commits.append(dict(offsets))

    def close(self) -> None:
        self.closed = True


def test_one_client_while_any_term_uses_it_and_a_new_one_after_the_last_closed() -> None:
    made: list[FakeClient] = []
    shared = SharedGroupOffsets(lambda: cast(Any, FakeClient(made)))
    shard0, shard1 = shared.mirror(), shared.mirror()
    shard0.publish({0: 10})
    shard1.publish({1: 7})
    assert len(made) == 1 and made[0].commits == [{0: 10}, {1: 7}]
    shard0.close()
    shard0.close()  # twice: released once
    shard0.publish({0: 11})  # a closed handle publishes nothing
    assert not made[0].closed
    shard1.close()
    assert made[0].closed and made[0].commits == [{0: 10}, {1: 7}]
    shared.mirror().publish({0: 12})
    assert len(made) == 2 and made[1].commits == [{0: 12}]


def test_terms_on_several_flush_threads_commit_one_at_a_time() -> None:
    made: list[FakeClient] = []
    shared = SharedGroupOffsets(lambda: cast(Any, FakeClient(made)))
    handles = [shared.mirror() for _ in range(4)]

    def flush(shard: int) -> None:
        for offset in range(200):
            handles[shard].publish({shard: offset})
        handles[shard].close()

    threads = [threading.Thread(target=flush, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(made) == 1 and made[0].closed
    assert sorted(c[s] for c in made[0].commits for s in c) == sorted(list(range(200)) * 4)
