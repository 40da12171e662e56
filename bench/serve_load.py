#!/usr/bin/python3
"""Load for an OpenAI-compatible server (trl serve, llama-server, vllm serve): C concurrent clients each send
streamed /v1/completions requests until R requests are done, and the figures are printed as one JSON line:
generated tokens per second of wall time, time to first token (median, p90), and per-client decode speed.

    python3 bench/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 32 --prompt_tokens 128 --max_tokens 64

Every request asks for exactly --max_tokens tokens (ignore_eos, greedy), its prompt a token-id list of
--prompt_tokens ids (the same lists for every server: seeded), so servers of the same model do the same work.
Python's standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def one_request(host, port, path, body, timeout):
    """Streams one completion; returns (seconds to the first token, seconds in all, tokens counted)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first, tokens, buf = None, 0, b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(4096)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            data = json.loads(event[6:])
            for choice in data.get("choices", []):
                if first is None and choice.get("text"):
                    first = time.perf_counter() - t0
            usage = data.get("usage")
            if usage:
                tokens = usage.get("completion_tokens", tokens)
    conn.close()
    return first if first is not None else time.perf_counter() - t0, time.perf_counter() - t0, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=None, help="the model name to send (default: none)")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=None, help="default: 4 per client")
    ap.add_argument("--prompt_tokens", type=int, default=128)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151643, help="prompt ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    total = a.requests or 4 * a.clients
    u = urllib.parse.urlparse(a.url)
    path = (u.path.rstrip("/") or "/v1") + "/completions"
    rng = random.Random(a.seed)
    prompts = [[rng.randrange(1000, a.vocab) for _ in range(a.prompt_tokens)] for _ in range(total)]
    next_index, lock, results, errors = [0], threading.Lock(), [], []

    def client():
        while True:
            with lock:
                i = next_index[0]
                if i >= total:
                    return
                next_index[0] += 1
            body = {"prompt": prompts[i], "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            if a.model:
                body["model"] = a.model
            try:
                r = one_request(u.hostname, u.port, path, body, a.timeout)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"serve_load.py: {len(errors)} requests failed, e.g. {errors[0]}")
    ttft = sorted(r[0] for r in results)
    tokens = sum(r[2] if r[2] else a.max_tokens for r in results)
    decode = [(a.max_tokens - 1) / (r[1] - r[0]) for r in results if r[1] > r[0]]
    print(json.dumps({"label": a.label, "clients": a.clients, "requests": total, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
                      "wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 2),
                      "ttft_median_s": round(statistics.median(ttft), 3), "ttft_p90_s": round(ttft[int(0.9 * (len(ttft) - 1))], 3),
                      "per_client_decode_tok_s": round(statistics.median(decode), 2) if decode else None}))


if __name__ == "__main__":
    main()
