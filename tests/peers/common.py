"""Shared parts of the Python Zenoh peers: the session, the rmw_zenoh key.

These peers use only PyPI packages written by others: eclipse-zenoh (the
Zenoh client) and rosbags (an independent CDR implementation and ROS 2
type store, which also computes the RIHS01 type hash).
"""

import argparse
import json
import sys

import zenoh
from rosbags.typesys import Stores, get_typestore

IMAGE = "sensor_msgs/msg/Image"
DDS_TYPE = "sensor_msgs::msg::dds_::Image_"
TYPESTORE = get_typestore(Stores.ROS2_JAZZY)


def image_key(domain, topic):
    """rmw_zenoh's data key, with the type hash rosbags computes."""
    return f"{domain}/{topic.lstrip('/')}/{DDS_TYPE}/{TYPESTORE.hash_rihs01(IMAGE)}"


def arguments(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--topic", required=True)
    p.add_argument("--domain", type=int, default=0)
    p.add_argument("--listen", action="append", default=[])
    p.add_argument("--connect", action="append", default=[])
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--timeout", type=float, default=60.0)
    return p


def open_session(args):
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    if args.listen:
        conf.insert_json5("listen/endpoints", json.dumps(args.listen))
    if args.connect:
        conf.insert_json5("connect/endpoints", json.dumps(args.connect))
    conf.insert_json5("scouting/multicast/enabled", "false")
    return zenoh.open(conf)


def finish(ok, summary):
    """Prints the summary as one JSON line; exit status 0 only when ok."""
    summary["ok"] = ok
    print(json.dumps(summary), flush=True)
    sys.exit(0 if ok else 1)
