"""Helper process for the SIGKILL test: append numbered records with fsync=always until killed.

Usage: python wal_kill_writer.py DIR SEGMENT_BYTES SEED. It continues after the highest sequence
number already in the log and prints each sequence number (flushed) once append() returned.
Also the single definition of the record contents the wal tests use (record_bytes).
"""

from __future__ import annotations

import json
import random
import sys

MAX_RECORDS = 1_000_000


def record_bytes(seq: int, size: int) -> tuple[bytes, bytes]:
    """The header and payload of record `seq`: distinct per record, any size."""
    return json.dumps({"seq": seq}).encode(), random.Random(seq).randbytes(size)


def main() -> None:
    from wal import WriteAheadLog

    directory, segment_bytes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    with WriteAheadLog.open(directory, fsync="always", segment_bytes=segment_bytes) as log:
        last = -1
        for record in log.replay():
            last = json.loads(record.header)["seq"]
        for seq in range(last + 1, last + 1 + MAX_RECORDS):
            header, payload = record_bytes(seq, rng.randrange(1, 256 << 10))
            log.append(header, payload)
            sys.stdout.write(f"{seq}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
