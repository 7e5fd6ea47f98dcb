#!/usr/bin/env python3
"""The README's llama-server recipe, checked: ``llama-server -m MODEL -ot nomatch=CPU`` with
``GGML_BACKEND_PATH`` set loads ssmk's backend, which updates the model's delta-rule states in
place, and greedy completions equal those of the same server with the backend switched off
(``SSMK_GGML_OPS=none``).

    server-check.py LLAMA_SERVER BACKEND_LIB MODEL

Python's standard library only (used by .ci/llama-lane).
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 9, 30, 41, 2, 11, 90, 3]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def completions(server, lib, model, extra_env):
    """Greedy tokens for PROMPTS from a fresh server, and its log."""
    port = free_port()
    env = dict(os.environ, GGML_BACKEND_PATH=lib, SSMK_GGML_VERBOSE="1", **extra_env)
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([server, "-m", model, "-ot", "nomatch=CPU", "--host", "127.0.0.1",
                                 "--port", str(port), "-t", "2", "-c", "256"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    sys.exit(f"llama-server did not come up:\n{log.read()[-3000:]}")
                time.sleep(0.5)
            tokens = [post(port, "/completion", {"prompt": p, "n_predict": 16, "temperature": 0,
                                                 "return_tokens": True})["tokens"] for p in PROMPTS]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        log.seek(0)
        return tokens, log.read()


def main():
    server, lib, model = sys.argv[1:4]
    on, on_log = completions(server, lib, model, {})
    off, off_log = completions(server, lib, model, {"SSMK_GGML_OPS": "none"})
    # The backend's own log line (SSMK_GGML_VERBOSE) shows it loaded and running.
    in_place = on_log.count("states updated in place")
    if in_place == 0 or "states updated in place" in off_log:
        sys.exit(f"in-place state updates: {in_place} with the backend, "
                 f"{off_log.count('states updated in place')} without")
    if on != off:
        sys.exit(f"greedy tokens differ:\n  with ssmk    {on}\n  without ssmk {off}")
    print(f"llama-server -ot nomatch=CPU: SSMK loaded, {in_place} in-place state updates, "
          f"{sum(map(len, on))} greedy tokens equal to the server without it")


if __name__ == "__main__":
    main()
