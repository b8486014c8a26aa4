"""A Zenoh subscriber no one here wrote the client of (eclipse-zenoh), for
`pipeline --publish zenoh/<topic>`.

It takes --count samples (bounded by --timeout), then checks them against
the producer's --publish-log (`<sequence> <frame> <crc32 hex>` per line):
the count, the order (attachment sequence numbers 1, 2, ...), and each
sample's data CRC-32 (zlib.crc32). Every sample is decoded as a CDR
sensor_msgs/msg/Image by rosbags, and the fields must be the ones asked
for (--width, --height, --encoding; step = width * 4 for rgba8). The
attachment is decoded with zenoh.ext.z_deserialize as rmw_zenoh's
(sequence_number, source_timestamp, source_gid).
"""

import os
import queue
import time
import zlib

import zenoh
import zenoh.ext as ze

from common import IMAGE, TYPESTORE, arguments, finish, image_key, open_session

ATTACHMENT = tuple[str, ze.Int64, str, ze.Int64, str, bytes]


def read_log(path, count, deadline):
    """The producer's log, once it has `count` lines (bounded)."""
    while True:
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                lines = [l.split() for l in f.read().splitlines() if l.strip()]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def check(sample, args, problems):
    """One sample: its sequence number and data CRC-32."""
    raw = sample.payload.to_bytes()
    msg = TYPESTORE.deserialize_cdr(raw, IMAGE)
    want = (args.width, args.height, args.encoding, args.width * args.bpp)
    got = (msg.width, msg.height, msg.encoding, msg.step)
    if got != want:
        problems.append(f"fields {got} != {want}")
    if len(msg.data) != msg.step * msg.height or msg.is_bigendian != 0:
        problems.append(f"data of {len(msg.data)} bytes, big endian {msg.is_bigendian}")
    key, seq, key2, _stamp, key3, gid = ze.z_deserialize(ATTACHMENT, sample.attachment)
    if (key, key2, key3) != ("sequence_number", "source_timestamp", "source_gid") or len(gid) != 16:
        problems.append(f"attachment keys {(key, key2, key3)}, gid of {len(gid)} bytes")
    return int(seq), zlib.crc32(bytes(msg.data)) & 0xFFFFFFFF


def main():
    p = arguments(__doc__)
    p.add_argument("--log", required=True)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--encoding", default="rgba8")
    p.add_argument("--bpp", type=int, default=4)
    p.add_argument("--ready", help="a file to create once subscribed")
    args = p.parse_args()
    key = image_key(args.domain, args.topic)
    samples = queue.Queue()
    session = open_session(args)
    sub = session.declare_subscriber(key, lambda s: samples.put(s))
    if args.ready:
        open(args.ready, "w").close()
    deadline = time.monotonic() + args.timeout
    got, problems = [], []
    while len(got) < args.count and time.monotonic() < deadline:
        try:
            sample = samples.get(timeout=0.2)
        except queue.Empty:
            continue
        if str(sample.key_expr) != key:
            problems.append(f"a sample on {sample.key_expr}")
            continue
        got.append(check(sample, args, problems))
    log = read_log(args.log, args.count, deadline)
    expected = [(int(s), int(c, 16)) for s, _frame, c in log]
    sub.undeclare()
    session.close()
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        problems.append(f"{len(got)} samples vs {len(expected)} log lines, first difference at {first}")
    if [s for s, _ in got] != list(range(1, args.count + 1)):
        problems.append("sequence numbers are not 1..count in order")
    finish(not problems and len(got) == args.count, {
        "peer": "eclipse-zenoh subscriber",
        "key": key,
        "received": len(got),
        "log_lines": len(expected),
        "crc_matches": sum(1 for a, b in zip(got, expected) if a == b),
        "problems": problems[:5],
    })


if __name__ == "__main__":
    main()
