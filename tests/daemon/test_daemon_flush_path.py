"""`FlushPath`: what a node says of its Spark session and workers, with fakes of both."""

from __future__ import annotations

import threading

from hakafka.daemon.flush_path import FlushPath, FlushPathState
from hakafka.ops.status import flush_path_text


class FakeSpark:
    """A session start that fails `failures` times, then returns a session."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.starts = 0
        self.warmed: list[object] = []
        self.release = threading.Event()
        self.release.set()

    def start(self) -> object:
        self.starts += 1
        self.release.wait(5)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Java gateway process exited\nat org.apache...")
        return "session"

    def warm_workers(self, session: object) -> None:
        self.warmed.append(session)


def test_cold_until_warmed_then_warm_once() -> None:
    spark = FakeSpark()
    path = FlushPath(spark.start, spark.warm_workers, lambda: False)
    cold = path.status
    assert cold.state is FlushPathState.COLD and not cold.ready
    path.warm()
    path.warm()  # a later election: nothing to do
    warm = path.status
    assert warm.state is FlushPathState.WARM and warm.ready
    assert spark.starts == 1 and spark.warmed == ["session"]
    report = path.status.report(path.status.since + 2.0)
    assert report["state"] == "warm" and report["for_s"] == 2.0 and report["error"] is None
    assert flush_path_text(report) == "warm"


def test_starting_while_spark_starts_in_the_background() -> None:
    spark = FakeSpark()
    spark.release.clear()
    path = FlushPath(spark.start, spark.warm_workers, lambda: False)
    thread = path.warm_in_background()
    assert thread.name == "spark-warm-up"
    for _ in range(100):
        if path.status.state is FlushPathState.STARTING:
            break
        threading.Event().wait(0.01)
    report = path.status.report(path.status.since + 4.4)
    assert flush_path_text(report) == "starting for 4 s"
    spark.release.set()
    thread.join(5)
    assert path.status.ready


def test_a_failed_warm_up_says_why_and_the_next_try_warms() -> None:
    spark = FakeSpark(failures=1)
    path = FlushPath(spark.start, spark.warm_workers, lambda: False)
    path.warm()  # never raises
    assert path.status.state is FlushPathState.FAILED
    assert path.status.error == "RuntimeError: Java gateway process exited"
    text = flush_path_text(path.status.report(path.status.since))
    assert text == "failed: RuntimeError: Java gateway process exited"
    path.warm()  # the next election tries again
    assert path.status.ready and spark.starts == 2


def test_a_node_that_did_not_say_shows_nothing() -> None:
    assert flush_path_text(None) is None
