"""A Zenoh publisher no one here wrote the client of (eclipse-zenoh), for
`pipeline --source zenoh/<topic>`.

It publishes --count rgba8 images of --width x --height, each serialized
as CDR sensor_msgs/msg/Image by rosbags (an independent encoder), with an
rmw_zenoh attachment written by zenoh.ext.z_serialize, on the topic's
rmw_zenoh key. It waits (bounded) for a matching subscriber first and
publishes with congestion control BLOCK, so no sample is dropped on its
side. Each frame's bytes depend on its number, so consecutive frames differ.
"""

import time
import zlib

import numpy as np
import zenoh
import zenoh.ext as ze

from common import IMAGE, TYPESTORE, arguments, finish, image_key, open_session


def frame_bytes(n, size):
    base = np.arange(size, dtype=np.uint32)
    return ((base * 7 + n * 13 + (base >> 9)) & 0xFF).astype(np.uint8)


def message(n, width, height):
    Image = TYPESTORE.types[IMAGE]
    Header = TYPESTORE.types["std_msgs/msg/Header"]
    Time = TYPESTORE.types["builtin_interfaces/msg/Time"]
    now = time.time_ns()
    header = Header(stamp=Time(sec=now // 10**9, nanosec=now % 10**9), frame_id="python")
    data = frame_bytes(n, width * height * 4)
    img = Image(header=header, height=height, width=width, encoding="rgba8",
                is_bigendian=0, step=width * 4, data=data)
    return bytes(TYPESTORE.serialize_cdr(img, IMAGE)), zlib.crc32(data.tobytes()) & 0xFFFFFFFF


def main():
    p = arguments(__doc__)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    args = p.parse_args()
    key = image_key(args.domain, args.topic)
    session = open_session(args)
    pub = session.declare_publisher(key, congestion_control=zenoh.CongestionControl.BLOCK)
    deadline = time.monotonic() + args.timeout
    while not pub.matching_status.matching:
        if time.monotonic() > deadline:
            finish(False, {"peer": "eclipse-zenoh publisher", "problems": ["no subscriber"]})
        time.sleep(0.02)
    gid = bytes(session.zid().__str__().encode()[:16].ljust(16, b"\0"))
    crcs = []
    for n in range(args.count):
        payload, crc = message(n, args.width, args.height)
        attachment = ze.z_serialize(("sequence_number", ze.Int64(n + 1), "source_timestamp",
                                     ze.Int64(time.time_ns()), "source_gid", gid))
        pub.put(payload, attachment=attachment)
        crcs.append(crc)
    # Let the last samples leave before the session closes.
    time.sleep(1.0)
    pub.undeclare()
    session.close()
    finish(True, {"peer": "eclipse-zenoh publisher", "key": key, "published": len(crcs)})


if __name__ == "__main__":
    main()
