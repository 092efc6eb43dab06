"""The writer's client pool: a client is lent again after a good insert, never after a failed
one, and the pool holds at most its limit (units, with a fake connection)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from chlib.clients import ClientPool
from chlib.connection import Connection


@dataclass
class FakeClient:
    host: str
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class FakeConnection(Connection):
    """Makes a FakeClient per call; hosts in `refused` raise as an unreachable server does."""

    refused: frozenset[str] = frozenset()
    made: list[FakeClient] = field(default_factory=list, compare=False, hash=False)

    def client(self, host: str, port: int, database: str | None = None, **kwargs: Any) -> Any:
        if host in self.refused:
            raise ConnectionRefusedError(f"{host}:{port} refused")
        self.made.append(FakeClient(host))
        return self.made[-1]


def test_a_client_is_lent_again_after_its_block_ends() -> None:
    pool, connection = ClientPool(), FakeConnection()

    with pool.client(connection, [("a", 1)], "db") as first:
        pass
    with pool.client(connection, [("a", 1)], "db") as second:
        pass

    assert second is first
    assert len(connection.made) == 1 and not connection.made[0].closed


def test_a_client_whose_block_raised_is_closed_and_not_lent_again() -> None:
    pool, connection = ClientPool(), FakeConnection()

    with pytest.raises(RuntimeError), pool.client(connection, [("a", 1)], "db") as failed:
        raise RuntimeError("insert failed")
    with pool.client(connection, [("a", 1)], "db") as fresh:
        pass

    assert fresh is not failed
    assert [c.closed for c in connection.made] == [True, False]


def test_other_hosts_or_databases_get_their_own_clients() -> None:
    pool, connection = ClientPool(), FakeConnection()

    with pool.client(connection, [("a", 1)], "db") as a:
        pass
    with pool.client(connection, [("b", 1)], "db") as b:
        pass
    with pool.client(connection, [("a", 1)], "other") as other:
        pass

    assert len({id(a), id(b), id(other)}) == 3


def test_the_first_host_that_accepts_a_connection_is_used() -> None:
    pool, connection = ClientPool(), FakeConnection(refused=frozenset({"down"}))

    with pool.client(connection, [("down", 1), ("up", 1)], "db"):
        pass

    assert [c.host for c in connection.made] == ["up"]
    with (
        pytest.raises(ConnectionRefusedError, match="down:1 refused"),
        pool.client(connection, [("down", 1)], "db"),
    ):
        pass


def test_the_least_recently_used_idle_client_is_closed_over_the_limit() -> None:
    pool, connection = ClientPool(limit=2), FakeConnection()

    for host in ("a", "b", "c"):
        with pool.client(connection, [(host, 1)], "db"):
            pass

    assert [c.closed for c in connection.made] == [True, False, False]
    pool.close()
    assert all(c.closed for c in connection.made)
