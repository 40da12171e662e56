"""Fixtures of `trl serve`'s tests: a tiny model (the 4096-token cut vocabulary) and a LoRA adapter trained on it for
three steps, and servers started on a free port. The client side is Python's standard library (http.client), so
these tests need nothing beyond python3 and pytest; test_openai_client.py adds PyPI's `openai` where it is installed."""

import http.client
import json
import os
import re
import signal
import subprocess
import time

import pytest

TRL = os.environ.get("TRL_BINARY", "trl")


def run_trl(*args):
    out = subprocess.run([TRL, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"trl {' '.join(map(str, args))} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model = root / "tiny"
    run_trl("init-model", "--preset", "tiny", "--vocab_size", "4096", "--seed", "3", "--initializer_range", "0.1", "--out", model)
    return model


@pytest.fixture(scope="session")
def adapter_dir(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter")
    data = root / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in [("What is 2 + 2?", "4."), ("Name a colour.", "Red."), ("What do bees make?", "Honey.")]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_trl("sft", "--model_name_or_path", model_dir, "--dataset_name", data, "--use_peft", "--lora_r", "8", "--max_steps", "3",
            "--learning_rate", "0.05", "--per_device_train_batch_size", "2", "--report_to", "none", "--output_dir", root / "a")
    return root / "a"


class Server:
    """A `trl serve` process on a free port; stop() sends SIGTERM and returns its exit code and stderr."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([TRL, "serve", "--port", "0", *map(str, args)], stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError("trl serve exited:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "ready:" in line:
                return
        raise AssertionError("trl serve did not become ready:\n" + "".join(self.log))

    def request(self, method, path, body=None, headers=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        return resp.status, dict(resp.getheaders()), raw

    def post(self, path, body, headers=None):
        status, hdrs, raw = self.request("POST", path, body, headers)
        return status, json.loads(raw) if raw.strip() else None, hdrs

    def stream(self, path, body):
        """The server-sent events of a streamed answer: the JSON chunks, and whether [DONE] ended them."""
        status, _, raw = self.request("POST", path, body)
        assert status == 200, raw
        chunks, done = [], False
        for event in raw.decode().split("\n\n"):
            if not event.strip() or event.startswith(":"):
                continue
            assert event.startswith("data: "), event
            payload = event[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "an event after [DONE]"
            chunks.append(json.loads(payload))
        return chunks, done

    def metrics(self):
        _, _, raw = self.request("GET", "/metrics")
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=120):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rest = self.proc.stderr.read()
        code = self.proc.wait(timeout=timeout)
        return code, "".join(self.log) + rest


@pytest.fixture(scope="session")
def server(model_dir, adapter_dir):
    s = Server("--model", model_dir, "--served_model_name", "tiny", "--adapter", f"tuned={adapter_dir}", "--max_batch", "8",
               "--max_model_len", "256", "--max_queue", "64")
    yield s
    code, log = s.stop()
    assert code == 0, log


def chat_body(content, **kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}
