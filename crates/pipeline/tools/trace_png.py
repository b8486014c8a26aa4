#!/usr/bin/env python3
"""Turns a `pipeline --trace` file into a PNG screenshot of a real trace viewer, offline.

The viewer is Catapult's trace viewer (the one behind chrome://tracing): its
`trace2html` packs the trace and the viewer into one HTML file, which headless
Chromium opens; the picture is taken once the viewer has imported the trace.

Needs: python3, a Catapult checkout (github.com/catapult-project/catapult; of it
only tracing/{tracing,tracing_build,tracing_project.py,bin/trace2html,third_party},
third_party/{polymer,six,beautifulsoup4-4.9.3,html5lib-1.1,webencodings-0.5.1}
and common/{py_utils,py_vulcanize} are read), Chromium (Debian: `apt-get install
chromium`) and the websocket-client package (`pip install websocket-client`)
to drive Chromium's DevTools protocol. Nothing is fetched from the network.

    python3 crates/pipeline/tools/trace_png.py TRACE.json OUT.png \\
        --catapult /path/to/catapult [--frames FIRST LAST | --from-ms A --to-ms B]
        [--size 1400x700]

`--frames` zooms the view to those frames' spans, `--from-ms/--to-ms` to that
part of the run (milliseconds from the trace's first span); without them the
whole trace is shown. The picture is the viewer's header and tracks.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import websocket  # websocket-client
except ImportError:
    sys.exit("error: needs the websocket-client package (pip install websocket-client)")


class DevTools:
    """A minimal client of one page's DevTools protocol."""

    def __init__(self, url):
        self.ws = websocket.create_connection(url, timeout=60)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")


def wait_for(what, limit_s, check):
    """Calls `check` until it is true; fails naming `what` after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    sys.exit(f"error: waited {limit_s} s for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--catapult", required=True, help="a Catapult checkout")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--size", default="1400x700", help="WIDTHxHEIGHT in pixels")
    ap.add_argument("--frames", type=int, nargs=2, metavar=("FIRST", "LAST"),
                    help="zoom to the spans of these frames (inclusive)")
    ap.add_argument("--from-ms", type=float)
    ap.add_argument("--to-ms", type=float)
    a = ap.parse_args()
    width, height = (int(v) for v in a.size.split("x"))

    work = tempfile.mkdtemp(prefix="trace-png-")
    chromium = None
    try:
        # Catapult compares times to the microsecond unless the file asks for
        # nanoseconds; the pipeline's file leaves that display option out
        # (Perfetto reads it as the unit of `ts`), so it is added to a copy.
        with open(a.trace) as f:
            trace = json.load(f)
        trace["displayTimeUnit"] = "ns"
        copy = os.path.join(work, os.path.basename(a.trace))
        with open(copy, "w") as f:
            json.dump(trace, f)
        html = os.path.join(work, "trace.html")
        trace2html = os.path.join(a.catapult, "tracing", "bin", "trace2html")
        # From the folder of the copy, so that the page's title names the
        # trace file only.
        subprocess.run([sys.executable, os.path.abspath(trace2html), os.path.basename(copy),
                        "--output", html], check=True, stdout=subprocess.DEVNULL, cwd=work)

        profile = os.path.join(work, "profile")
        chromium = subprocess.Popen(
            [a.chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--hide-scrollbars", "--no-first-run", f"--user-data-dir={profile}",
             "--remote-debugging-port=0", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(profile, "DevToolsActivePort")
        wait_for("Chromium's DevTools port", 30, lambda: os.path.exists(port_file)
                 and open(port_file).read().split("\n")[0].strip())
        port = open(port_file).read().split("\n")[0].strip()
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(p for p in pages if p.get("type") == "page")
        dt = DevTools(page["webSocketDebuggerUrl"])
        dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                deviceScaleFactor=1, mobile=False)
        dt.call("Page.navigate", url="file://" + html)
        wait_for("the trace viewer to import the trace", 120, lambda: dt.evaluate(
            "typeof g_timelineViewEl !== 'undefined' && !!g_timelineViewEl.model"))
        time.sleep(1.0)  # the viewer sets its initial view after the import
        # The world range to show, in the viewer's milliseconds.
        if a.frames is not None:
            lo_f, hi_f = a.frames
            world = dt.evaluate(
                "(() => { let lo = Infinity, hi = -Infinity;"
                " for (const t of g_timelineViewEl.model.getAllThreads())"
                "  for (const s of t.sliceGroup.slices) {"
                "   const f = s.args.frame;"
                f"   if (f >= {lo_f} && f <= {hi_f}) {{ lo = Math.min(lo, s.start); hi = Math.max(hi, s.end); }} }}"
                " if (lo > hi) return null; const pad = (hi - lo) * 0.02; return [lo - pad, hi + pad]; })()")
            if world is None:
                sys.exit(f"error: the trace has no spans of frames {lo_f}..={hi_f}")
        elif a.from_ms is not None and a.to_ms is not None:
            m = dt.evaluate("g_timelineViewEl.model.bounds.min")
            world = [m + a.from_ms, m + a.to_ms]
        else:
            world = None
        if world is not None:
            dt.evaluate(
                "(() => { const tv = g_timelineViewEl.trackView;"
                " const vp = tv.viewport;"
                " const dt = new tr.ui.TimelineDisplayTransform();"
                " dt.set(vp.currentDisplayTransform);"
                f" dt.xSetWorldBounds({world[0]}, {world[1]}, tv.viewWidth_);"
                " vp.setDisplayTransformImmediately(dt); })()")
        time.sleep(1.0)  # let the tracks redraw
        # Only the view's header and tracks, not the empty space below them
        # nor the (empty) selection panel.
        box = dt.evaluate(
            "(() => { const r = g_timelineViewEl.trackView.modelTrackContainer_"
            ".canvas.getBoundingClientRect(); return [Math.ceil(r.right), Math.ceil(r.bottom)]; })()")
        clip = {"x": 0, "y": 0, "width": min(width, box[0]), "height": min(height, box[1] + 4),
                "scale": 1}
        shot = dt.call("Page.captureScreenshot", format="png", clip=clip)
        with open(a.png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(f"{a.png}: {os.path.getsize(a.png)} bytes")
    finally:
        if chromium is not None:
            chromium.terminate()
            chromium.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
