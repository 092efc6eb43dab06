"""The chaos run's network namespace picks a /30 of its own: a namespace left behind by an
interrupted run (its veth's root end still holding 10.213.0.1) cannot shadow the next one."""

from __future__ import annotations

from devstack.chaos.netns import free_pair


def test_the_first_free_slash_30_is_taken() -> None:
    assert free_pair([]) == ("10.213.0.1", "10.213.0.2")
    # A leftover root end on the first /30, another address on the second.
    assert free_pair(["127.0.0.1", "10.213.0.1", "10.213.0.6"]) == ("10.213.0.9", "10.213.0.10")
    # Across the third octet.
    used = [f"10.213.0.{i}" for i in range(0, 256, 4)]
    assert free_pair(used) == ("10.213.1.1", "10.213.1.2")
