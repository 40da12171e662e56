"""`trl serve` over HTTP, with Python's standard library as the client: answers equal `trl generate`'s, streaming
equals the whole answer, n, logprobs, stop strings, echo, token ids, adapters, the OpenAI error shape for 50+ bad
requests, 429 when full, disconnects freeing rows, the API key, SIGTERM draining, and 32 concurrent clients."""

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from conftest import TRL, Server, chat_body, run_trl


def generate(model_dir, prompt, n, *extra):
    out = run_trl("generate", "--model", model_dir, "--prompt", prompt, "--max_new_tokens", n, "--do_sample", "false", *extra)
    assert out.endswith("\n")
    return out[:-1]


def test_greedy_answers_equal_trl_generate(server, model_dir):
    status, body, _ = server.post("/v1/chat/completions", chat_body("The French Bread Law", max_tokens=12))
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == generate(model_dir, "The French Bread Law", 12, "--chat")
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12

    status, body, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "The French Bread Law states", "max_tokens": 10, "temperature": 0})
    assert status == 200, body
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == generate(model_dir, "The French Bread Law states", 10)


def test_trl_chat_url_talks_to_the_server(server):
    out = subprocess.run([TRL, "chat", "--url", f"http://127.0.0.1:{server.port}", "--model", "tiny", "--max_new_tokens", "8", "--do_sample", "false"],
                         input="The French Bread Law\nAnd then?\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    _, first, _ = server.post("/v1/chat/completions", chat_body("The French Bread Law", max_tokens=8))
    answer = first["choices"][0]["message"]["content"]
    messages = [{"role": "user", "content": "The French Bread Law"}, {"role": "assistant", "content": answer},
                {"role": "user", "content": "And then?"}]
    _, second, _ = server.post("/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert out.stdout == answer + "\n" + second["choices"][0]["message"]["content"] + "\n"
    # A model the server does not have, or no server: the error, and the chat goes on.
    out = subprocess.run([TRL, "chat", "--url", f"http://127.0.0.1:{server.port}/v1", "--model", "nope"], input="Hi\n", capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "404: The model 'nope' does not exist" in out.stderr
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    out = subprocess.run([TRL, "chat", "--url", f"http://127.0.0.1:{port}"], input="Hi\n", capture_output=True, text=True, timeout=60)
    assert "could not connect" in out.stderr


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_as_the_docs_use_it(server):
    body = json.dumps(chat_body("The French Bread Law", max_tokens=6))
    plain = subprocess.run(["curl", "-s", f"http://127.0.0.1:{server.port}/v1/chat/completions", "-d", body], capture_output=True, text=True, timeout=60)
    answer = json.loads(plain.stdout)["choices"][0]["message"]["content"]
    streamed = subprocess.run(["curl", "-sN", f"http://127.0.0.1:{server.port}/v1/chat/completions", "-d", body[:-1] + ', "stream": true}'],
                              capture_output=True, text=True, timeout=60)
    events = [e[len("data: "):] for e in streamed.stdout.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]) == answer
    models = subprocess.run(["curl", "-s", f"http://127.0.0.1:{server.port}/v1/models"], capture_output=True, text=True, timeout=60)
    assert json.loads(models.stdout)["data"][0]["id"] == "tiny"


def test_a_streamed_answer_equals_the_whole_one(server):
    for path, body in [("/v1/chat/completions", chat_body("Tell me a story", max_tokens=20)),
                       ("/v1/completions", {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})]:
        status, whole, _ = server.post(path, body)
        assert status == 200
        chunks, done = server.stream(path, {**body, "stream": True, "stream_options": {"include_usage": True}})
        assert done
        *parts, usage = chunks
        assert usage["choices"] == [] and usage["usage"] == whole["usage"]
        if path.endswith("chat/completions"):
            assert parts[0]["choices"][0]["delta"]["role"] == "assistant"
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in parts)
            assert text == whole["choices"][0]["message"]["content"]
            assert all(c["object"] == "chat.completion.chunk" for c in parts)
        else:
            text = "".join(c["choices"][0]["text"] for c in parts)
            assert text == whole["choices"][0]["text"]
        assert parts[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in parts[:-1])
        assert len({c["id"] for c in chunks}) == 1


def test_n_choices_with_a_seed_repeat_and_differ(server):
    body = chat_body("Pick a word", max_tokens=8, n=4, temperature=1.5, top_k=0, seed=11)
    status, a, _ = server.post("/v1/chat/completions", body)
    assert status == 200, a
    _, b, _ = server.post("/v1/chat/completions", body)
    texts = [c["message"]["content"] for c in a["choices"]]
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    assert texts == [c["message"]["content"] for c in b["choices"]]  # the same seed, the same choices
    assert len(set(texts)) > 1  # each choice draws its own tokens
    assert a["usage"]["completion_tokens"] == 32
    _, c, _ = server.post("/v1/chat/completions", {**body, "seed": 12})
    assert [x["message"]["content"] for x in c["choices"]] != texts
    # Streamed choices carry their index; together they are the non-streamed answer.
    chunks, done = server.stream("/v1/chat/completions", {**body, "stream": True})
    assert done
    streamed = ["", "", "", ""]
    for ch in chunks:
        for choice in ch["choices"]:
            streamed[choice["index"]] += choice["delta"].get("content", "")
    assert streamed == texts


def test_logprobs_are_log_softmax_values_and_top_lists_sorted(server):
    status, body, _ = server.post("/v1/chat/completions", chat_body("Hello", max_tokens=6, logprobs=True, top_logprobs=3))
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the chosen token is the most likely
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
    status, body, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 5, "temperature": 0, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_stop_strings_end_the_text_before_them(server):
    _, free, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "Count", "max_tokens": 24, "temperature": 0})
    text = free["choices"][0]["text"]
    stop = text[8:11]
    assert len(stop) == 3
    for stream in (False, True):
        body = {"model": "tiny", "prompt": "Count", "max_tokens": 24, "temperature": 0, "stop": [stop, "never-appears"]}
        if stream:
            chunks, _ = server.stream("/v1/completions", {**body, "stream": True})
            got = "".join(c["choices"][0]["text"] for c in chunks)
            reason = chunks[-1]["choices"][0]["finish_reason"]
        else:
            _, r, _ = server.post("/v1/completions", body)
            got, reason = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
        assert got == text[: text.find(stop)]
        assert reason == "stop"


def test_echo_token_ids_and_token_id_prompts(server, model_dir):
    _, a, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "The sky is", "max_tokens": 6, "temperature": 0, "echo": True,
                                              "return_token_ids": True})
    choice = a["choices"][0]
    assert choice["text"].startswith("The sky is")
    assert len(choice["token_ids"]) == 6 and a["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])
    # The same prompt as token ids gives the same tokens; several prompts give a choice each.
    _, b, _ = server.post("/v1/completions", {"model": "tiny", "prompt": [choice["prompt_token_ids"], "Another"], "max_tokens": 6, "temperature": 0,
                                              "return_token_ids": True})
    assert b["choices"][0]["token_ids"] == choice["token_ids"]
    assert b["choices"][1]["text"] == generate(model_dir, "Another", 6)


def test_an_adapter_is_a_model_of_its_own(server, model_dir, adapter_dir):
    status, _, raw = server.request("GET", "/v1/models")
    ids = [m["id"] for m in json.loads(raw)["data"]]
    assert ids == ["tiny", "tuned"]
    _, tuned, _ = server.post("/v1/completions", {"model": "tuned", "prompt": "What is 2 + 2?", "max_tokens": 8, "temperature": 0, "logprobs": 0})
    _, base, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "What is 2 + 2?", "max_tokens": 8, "temperature": 0, "logprobs": 0})
    assert tuned["model"] == "tuned"
    assert tuned["choices"][0]["text"] == generate(model_dir, "What is 2 + 2?", 8, "--adapter", adapter_dir)
    assert tuned["choices"][0]["logprobs"]["token_logprobs"] != base["choices"][0]["logprobs"]["token_logprobs"]


BAD_REQUESTS = [
    # (path, body, status, param)
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", b"\"text\"", 400, None),
    ("/v1/chat/completions", b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", 400, None),
    ("/v1/chat/completions", b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}", 400, None),
    ("/v1/chat/completions", {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [1]}, 400, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": 3, "content": "hi"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "messages[0].content[0].text"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ("/v1/chat/completions", {"model": 7, "messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 30}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 250}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -5}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_k": -2}, 400, "top_k"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "min_p": 2}, 400, "min_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 100000}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": True}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400, "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": 3}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 1}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": 5}, 400, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ["a", 1]}, 400, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": "x"}, 400, "seed"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 1.0}, 400, "presence_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": "none"}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": []}, 400, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop_token_ids": [999999]}, 400, "stop_token_ids"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5000}]}, 400, "messages"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, -3]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 5000]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], {"a": 1}]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "echo": 1}, 400, "echo"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": None, "n": -1}, 400, "n"),
]


def test_bad_requests_get_an_openai_error_and_the_server_keeps_serving(server):
    assert len(BAD_REQUESTS) >= 50
    for path, body, status, param in BAD_REQUESTS:
        if isinstance(body, dict):
            body = {"model": "tiny", **body} if "model" not in body else body
        got, hdrs, raw = server.request("POST", path, body)
        assert got == status, (body, raw)
        err = json.loads(raw)["error"]
        assert err["message"] and err["type"] in ("invalid_request_error", "not_found_error"), err
        assert err["param"] == param, (body, err)
    # Other methods, paths and HTTP-level faults.
    for method, path, status in [("GET", "/v1/chat/completions", 404), ("POST", "/v1/nothing", 404), ("DELETE", "/v1/models", 404)]:
        got, _, raw = server.request(method, path, {} if method == "POST" else None)
        assert got == status, raw
        assert json.loads(raw)["error"]["message"]
    huge = b"{\"prompt\": \"" + b"a" * (9 << 20) + b"\"}"
    got, _, raw = server.request("POST", "/v1/completions", huge)
    assert got == 413, raw
    assert server.request("GET", "/health")[0] == 200
    status, body, _ = server.post("/v1/chat/completions", chat_body("Still there?", max_tokens=3))
    assert status == 200 and body["usage"]["completion_tokens"] == 3


def raw_exchange(port, data, timeout=20.0):
    """Sends raw bytes, half-closes, and returns what the server answers."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_truncated_bodies_partial_headers_and_garbage_never_stop_the_server(server):
    # A body shorter than its Content-Length, then the client stops sending.
    out = raw_exchange(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"hi\"")
    assert out == b"" or out.startswith(b"HTTP/1.1 4"), out[:200]
    assert raw_exchange(server.port, b"\x00\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400") or True
    # Slowloris: a connection that sends part of its headers and stalls holds one thread, never the server.
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    for s in stalled:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    status, body, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "ok", "max_tokens": 2, "temperature": 0})
    assert status == 200, body
    for s in stalled:
        s.close()
    assert server.request("GET", "/health")[0] == 200


def test_a_client_that_goes_away_frees_its_row(server):
    before = server.metrics()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    body = json.dumps({"model": "tiny", "prompt": "A long one", "max_tokens": 190, "temperature": 0, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m["trl_sequences_running"] == 0 and m["trl_http_client_disconnects_total"] > before["trl_http_client_disconnects_total"]:
            break
        time.sleep(0.05)
    m = server.metrics()
    assert m["trl_sequences_running"] == 0
    assert m["trl_http_client_disconnects_total"] == before["trl_http_client_disconnects_total"] + 1
    # Cancelled before its 190 tokens.
    assert m["trl_generation_tokens_total"] - before["trl_generation_tokens_total"] < 190


def test_thirty_two_concurrent_clients_get_their_single_request_answers(server):
    prompts = [f"Question {i}: " + "word " * (i % 7 * 5) for i in range(32)]
    lengths = [4 + (i * 5) % 23 for i in range(32)]

    def ask(i):
        status, body, _ = server.post("/v1/completions", {"model": "tiny", "prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0})
        assert status == 200, body
        return body["choices"][0]["text"], body["usage"]["completion_tokens"]

    alone = [ask(i) for i in range(32)]  # one at a time
    before = server.metrics()
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(ask, list(range(32)) * 3))
    assert together == alone * 3
    after = server.metrics()
    assert after["trl_sequences_finished_total"] - before["trl_sequences_finished_total"] == 96
    assert after["trl_batch_occupancy"] > 0


@pytest.mark.skipif(os.environ.get("TRL_SANITIZED") == "1", reason="AddressSanitizer keeps freed memory in quarantine by design")
def test_memory_is_flat_over_a_thousand_requests(server):
    def ask(i):
        status, _, _ = server.post("/v1/completions", {"model": "tiny", "prompt": f"r{i} " * (1 + i % 9), "max_tokens": 2 + i % 5,
                                                       "temperature": 0.8, "seed": i, "logprobs": i % 3})
        assert status == 200
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, range(200)))
    warm = server.rss_kib()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, range(1000)))
    grown = server.rss_kib() - warm
    assert grown < 16 * 1024, f"RSS grew {grown} KiB over 1,000 requests"


def test_a_full_queue_answers_429_with_retry_after(model_dir):
    s = Server("--model", model_dir, "--max_batch", "1", "--max_queue", "0", "--max_model_len", "2048")
    try:
        long = threading.Thread(target=s.post, args=("/v1/completions", {"prompt": "x", "max_tokens": 1900, "temperature": 0}))
        long.start()
        deadline = time.time() + 30
        while s.metrics().get("trl_sequences_running", 0) < 1 and time.time() < deadline:
            time.sleep(0.005)
        # The one row is taken and nothing may wait: a second request is refused while the first runs.
        # More sequences than the server ever holds at once is a bad request, not a busy server.
        status, body, _ = s.post("/v1/completions", {"prompt": "y", "max_tokens": 2, "n": 2})
        assert status == 400 and body["error"]["param"] == "n", body
        status, body, hdrs = s.post("/v1/completions", {"prompt": "y", "max_tokens": 2})
        assert long.is_alive()
        assert status == 429, body
        assert hdrs.get("Retry-After") == "1"
        assert body["error"]["type"] == "rate_limit_error"
        long.join()
        assert s.metrics()["trl_http_requests_rejected_busy_total"] == 1
        status, body, _ = s.post("/v1/completions", {"prompt": "y", "max_tokens": 2})
        assert status == 200, body
    finally:
        code, log = s.stop()
    assert code == 0, log


def test_the_api_key_guards_every_endpoint_but_health(model_dir):
    s = Server("--model", model_dir, "--api_key", "sekret", "--max_model_len", "128")
    try:
        assert s.request("GET", "/health")[0] == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")]:
            status, _, raw = s.request(method, path, {"prompt": "hi", "max_tokens": 1} if method == "POST" else None)
            assert status == 401, raw
            assert json.loads(raw)["error"]["type"] == "authentication_error"
            status, _, _ = s.request(method, path, {"prompt": "hi", "max_tokens": 1} if method == "POST" else None,
                                     headers={"Authorization": "Bearer wrong"})
            assert status == 401
            status, _, _ = s.request(method, path, {"prompt": "hi", "max_tokens": 1} if method == "POST" else None,
                                     headers={"Authorization": "Bearer sekret"})
            assert status == 200
    finally:
        s.stop()


def test_sigterm_lets_the_running_requests_finish(model_dir):
    s = Server("--model", model_dir, "--max_model_len", "512")
    result = {}

    def long_request():
        result["r"] = s.post("/v1/completions", {"prompt": "x", "max_tokens": 400, "temperature": 0})

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.time() + 30
    while s.metrics().get("trl_sequences_running", 0) < 1 and time.time() < deadline:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    t.join(120)
    code, log = s.stop()
    assert code == 0, log
    status, body, _ = result["r"]
    assert status == 200 and body["usage"]["completion_tokens"] == 400, body
    assert "SIGTERM: finishing the running requests" in log and "stopped" in log


def test_a_model_that_cannot_load_ends_the_server_with_the_reason(tmp_path):
    # The server listens first (GET /health answers 503 while a model loads), then exits with the loading error.
    s = subprocess.Popen([TRL, "serve", "--port", "0", "--model", str(tmp_path / "missing")], stderr=subprocess.PIPE, text=True)
    err = s.stderr.read()
    assert s.wait(60) != 0
    assert "listening on" in err and str(tmp_path / "missing") in err, err
