"""`trl serve` with the real OpenAI client (PyPI's `openai`, a test-only dependency like the other oracles; skipped
where it is not installed): chat, streaming, n, logprobs, stop strings, adapters and errors as the client sees them."""

import pytest
from conftest import chat_body

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def test_chat_and_its_stream_agree_and_equal_the_http_answer(client, server):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "The French Bread Law"}], max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    _, raw, _ = server.post("/v1/chat/completions", chat_body("The French Bread Law", max_tokens=12))
    assert r.choices[0].message.content == raw["choices"][0]["message"]["content"]
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "The French Bread Law"}], max_tokens=12,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_n_logprobs_and_stop_through_the_client(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=6, n=3, temperature=1.2, seed=5,
                                       logprobs=True, top_logprobs=2)
    assert len(r.choices) == 3 and len({c.message.content for c in r.choices}) > 1
    for c in r.choices:
        assert len(c.logprobs.content) == 6
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in c.logprobs.content)
    free = client.completions.create(model="tiny", prompt="Count", max_tokens=24, temperature=0).choices[0].text
    stop = free[8:11]
    cut = client.completions.create(model="tiny", prompt="Count", max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == free[: free.find(stop)] and cut.choices[0].finish_reason == "stop"
    lp = client.completions.create(model="tiny", prompt="Count", max_tokens=4, temperature=0, logprobs=3)
    assert len(lp.choices[0].logprobs.top_logprobs) == 4


def test_models_adapters_and_errors_as_the_client_sees_them(client):
    assert [m.id for m in client.models.list().data] == ["tiny", "tuned"]
    tuned = client.completions.create(model="tuned", prompt="What is 2 + 2?", max_tokens=4, temperature=0)
    assert tuned.model == "tuned"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-4o" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], presence_penalty=1.0)
