#!/usr/bin/env python3
"""Captures a real llama-server /metrics page for the parser's fixtures (issue 51): starts one
server on the tiny model (2 slots), sends a plain and a streamed chat request, then four long
requests at once and reads /metrics while two run and two wait for a slot.
Usage: capture-metrics.py LLAMA_SERVER MODEL OUT_BUSY OUT_IDLE (paths from tools/llama/build.sh)."""

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, body: dict) -> bytes:
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def get(base: str, path: str) -> bytes:
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return r.read()


def main(server: str, model: str, out_busy: str, out_idle: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--metrics",
            "-c", "4096", "-np", "2", "--cache-ram", "0", "-t", "2"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                if get(base, "/health"):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit("capture: llama-server did not become healthy in 30 s")
        msgs = [{"role": "user", "content": "Hello there, how are you today?"}]
        usage = json.loads(post(base, {"messages": msgs, "max_tokens": 16}))["usage"]
        print("plain usage:", usage)
        stream = post(base, {"messages": msgs, "max_tokens": 16, "stream": True,
                             "stream_options": {"include_usage": True}})
        print("streamed:", stream.count(b"data:"), "events")
        long = {"messages": msgs, "max_tokens": 3000, "ignore_eos": True}
        threads = [threading.Thread(target=post, args=(base, long)) for _ in range(4)]
        for t in threads:
            t.start()
        busy = b""
        for _ in range(100):
            time.sleep(0.05)
            busy = get(base, "/metrics")
            if b"llamacpp:requests_deferred 2" in busy and b"requests_processing 2" in busy:
                break
        open(out_busy, "wb").write(busy)
        for t in threads:
            t.join()
        open(out_idle, "wb").write(get(base, "/metrics"))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
