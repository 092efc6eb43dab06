"""The real ZooKeeper server answers kazoo, and kazoo's election recipe elects one of two."""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.client import KazooClient

from devstack.zookeeper import ZooKeeperEnsemble

pytestmark = pytest.mark.integration


def test_two_clients_elect_exactly_one_leader(zookeeper: ZooKeeperEnsemble, zk_root: str) -> None:
    clients = [KazooClient(hosts=zookeeper.hosts, timeout=3.0) for _ in range(2)]
    leaders: list[str] = []
    elected = threading.Event()
    release = threading.Event()
    for client in clients:
        client.start(timeout=10)
    try:
        elections = [
            c.Election(f"{zk_root}/election", identifier=f"n{i}") for i, c in enumerate(clients)
        ]

        def lead(name: str) -> None:
            leaders.append(name)
            elected.set()
            release.wait(10)

        threads = [
            threading.Thread(target=e.run, args=(lead, f"n{i}"), daemon=True)
            for i, e in enumerate(elections)
        ]
        for t in threads:
            t.start()
        assert elected.wait(10), "no leader elected within 10 s"
        # The first may win before the second has queued up: wait (bounded) for both.
        deadline = time.monotonic() + 10
        while len(contenders := elections[0].contenders()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(contenders) == ["n0", "n1"]
        assert leaders == [contenders[0]], "exactly the first contender leads"
        # The leader resigns: the other one takes over, never both at once.
        elected.clear()
        release.set()
        assert elected.wait(10), "the second candidate did not take over"
        assert sorted(leaders) == ["n0", "n1"]
        for e in elections:
            e.cancel()
        for t in threads:
            t.join(10)
    finally:
        for client in clients:
            client.stop()
            client.close()


def test_four_letter_words_enabled(zookeeper: ZooKeeperEnsemble) -> None:
    from devstack.zookeeper import four_letter_word

    port = zookeeper.members[0].client_port
    assert four_letter_word(port, "ruok") == "imok"
    assert "zk_server_state" in four_letter_word(port, "mntr")
    assert "zookeeper.version" in four_letter_word(port, "envi")
