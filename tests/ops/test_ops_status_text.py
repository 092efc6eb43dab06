"""What `hakafka status` prints in a pipeline's STATE column."""

from __future__ import annotations

from hakafka.ops.status import state_text


def test_state_names_a_pending_reflush_and_an_error() -> None:
    assert state_text({"state": "consuming"}) == "consuming"
    reflushing = {"state": "consuming", "reflushing": True, "pending_block": "9f2c"}
    assert state_text(reflushing) == "consuming, re-flushing pending 9f2c"
    failing = {**reflushing, "error": "flush failing: ConnectionError: refused"}
    assert state_text(failing) == (
        "consuming, re-flushing pending 9f2c: flush failing: ConnectionError: refused"
    )
