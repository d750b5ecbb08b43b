"""OpenAI's Files and Batch APIs through the official client against a real server (the bundled
model on the CPU): a batch's answers equal the same requests sent one by one, failed lines go to
the error file with their status, bad input is refused, and a cancelled batch stops its requests
and leaves the server serving."""

from __future__ import annotations

import io
import json
import time

import pytest

from helpers import launch_server, openai_client, stop_server

openai = pytest.importorskip("openai")

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def client():
    proc, url = launch_server(["--device", "cpu", "--max-total-tokens", "8192",
                               "--log-level", "warning"], 180)
    try:
        yield openai_client(url)
    finally:
        stop_server(proc)


def _jsonl(lines: list[dict]) -> io.BytesIO:
    f = io.BytesIO(("\n".join(json.dumps(x) for x in lines) + "\n").encode())
    f.name = "requests.jsonl"
    return f


def _line(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _wait(client, batch_id: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.3)


def _records(client, file_id: str) -> dict[str, dict]:
    text = client.files.content(file_id).text
    records = [json.loads(x) for x in text.splitlines() if x.strip()]
    return {r["custom_id"]: r for r in records}


def test_batch_answers_match_single_requests(client):
    bodies = {
        "colors": {"model": "m", "messages": [{"role": "user", "content": "Name three colors."}],
                   "max_tokens": 8, "temperature": 0},
        "france": {"model": "m", "messages": [{"role": "user", "content": "Where is Paris?"}],
                   "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2},
        "bad": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": -3},
    }
    upload = client.files.create(file=_jsonl([_line(k, v) for k, v in bodies.items()]),
                                 purpose="batch")
    assert upload.purpose == "batch" and upload.bytes > 0
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                  completion_window="24h", metadata={"run": "test"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "test"}
    batch = _wait(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed,
            batch.request_counts.failed) == (3, 2, 1)
    assert batch.completed_at is not None and batch.in_progress_at is not None

    out = _records(client, batch.output_file_id)
    assert set(out) == {"colors", "france"}
    for custom_id in ("colors", "france"):
        rec = out[custom_id]
        assert rec["error"] is None and rec["id"].startswith("batch_req_")
        assert rec["response"]["status_code"] == 200
        got = rec["response"]["body"]
        assert got["object"] == "chat.completion"
        alone = client.chat.completions.create(**bodies[custom_id])
        assert got["choices"][0]["message"]["content"] == alone.choices[0].message.content
        assert got["usage"]["completion_tokens"] == alone.usage.completion_tokens
    top = out["france"]["response"]["body"]["choices"][0]["logprobs"]["content"][0]
    assert len(top["top_logprobs"]) == 2

    errors = _records(client, batch.error_file_id)
    assert set(errors) == {"bad"}
    assert errors["bad"]["response"]["status_code"] == 400
    assert "max_tokens" in errors["bad"]["response"]["body"]["error"]["message"]

    listed = client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]


def test_completions_batch(client):
    upload = client.files.create(file=_jsonl([_line(
        "c1", {"model": "m", "prompt": "The capital of France is", "max_tokens": 5,
               "temperature": 0}, url="/v1/completions")]), purpose="batch")
    batch = _wait(client, client.batches.create(input_file_id=upload.id,
                                                endpoint="/v1/completions",
                                                completion_window="24h").id)
    assert batch.status == "completed" and batch.error_file_id is None
    body = _records(client, batch.output_file_id)["c1"]["response"]["body"]
    alone = client.completions.create(model="m", prompt="The capital of France is",
                                      max_tokens=5, temperature=0)
    assert body["choices"][0]["text"] == alone.choices[0].text


def test_files_api(client):
    data = _jsonl([_line("a", {"model": "m", "messages": []})])
    upload = client.files.create(file=data, purpose="batch")
    assert client.files.retrieve(upload.id).filename == "requests.jsonl"
    assert upload.id in [f.id for f in client.files.list(purpose="batch").data]
    assert client.files.content(upload.id).content == data.getvalue()
    assert client.files.delete(upload.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=_jsonl([]), purpose="nonsense")


def test_bad_batches_are_refused(client):
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint=CHAT,
                              completion_window="24h")
    good = client.files.create(file=_jsonl([_line("a", {"model": "m", "messages": []})]),
                               purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=good.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    # A file whose line names another endpoint, or repeats a custom_id, fails the batch.
    for lines, line_no in (([_line("a", {}, url="/v1/completions")], 1),
                           ([_line("a", {}), _line("a", {})], 2)):
        bad = client.files.create(file=_jsonl(lines), purpose="batch")
        batch = client.batches.create(input_file_id=bad.id, endpoint=CHAT,
                                      completion_window="24h")
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.errors.data[0].line == line_no
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    # Every bad line is listed; a line the HTTP reader would refuse (a lone surrogate escape,
    # nesting past the depth limit) fails the batch too instead of reaching the engine.
    raw = b"\n".join([json.dumps(_line("a", {})).encode(), b'{"custom_id": "b", "url": "'
                       + CHAT.encode() + b'", "body": {"model": "m\\ud800"}}',
                       b"[" * 5000 + b"]" * 5000, b"not json"])
    bad = client.files.create(file=("deep.jsonl", raw), purpose="batch")
    batch = client.batches.create(input_file_id=bad.id, endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed" and [e.line for e in batch.errors.data] == [2, 3, 4]
    notes = client.files.create(file=_jsonl([_line("a", {})]), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.batches.create(input_file_id=notes.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.batches.create(input_file_id=good.id, endpoint=CHAT, completion_window="24h",
                              metadata={f"k{i}": "v" for i in range(17)})


def test_uploads_are_checked(client):
    """An upload can't claim the batches' own output purpose, and a cut-off multipart body or
    one with two `file` parts is refused rather than half-read."""
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=_jsonl([_line("a", {})]), purpose="batch_output")
    httpx = pytest.importorskip("httpx")
    head = b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    part = (b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
            + json.dumps(_line("a", {})).encode() + b"\r\n")
    url = str(client.base_url).rstrip("/") + "/files"
    for body, why in ((head + part, "closing boundary"),
                      (head + part + part + b"--XX--\r\n", "more than one")):
        r = httpx.post(url, content=body,
                       headers={"content-type": "multipart/form-data; boundary=XX"})
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    after = client.files.create(file=_jsonl([_line("a", {})]), purpose="user_data").id
    with pytest.raises(openai.NotFoundError, match="purpose 'batch'"):
        client.files.list(purpose="batch", after=after)
    r = httpx.get(url, params={"limit": "abc"})     # (a query parameter is named as it is sent)
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text


def test_failed_validation_counts_no_requests(client):
    lines = [_line("a", {"model": "m", "messages": []}), _line("a", {})]
    bad = client.files.create(file=_jsonl(lines), purpose="batch")
    batch = client.batches.create(input_file_id=bad.id, endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (0, 0, 0)


def test_a_stream_that_is_not_a_boolean_gets_the_endpoints_error(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "no"}
    upload = client.files.create(file=_jsonl([_line("s", body)]), purpose="batch")
    batch = _wait(client, client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                                completion_window="24h").id)
    assert batch.request_counts.failed == 1
    error = _records(client, batch.error_file_id)["s"]["response"]
    assert error["status_code"] == 400
    message = error["body"]["error"]["message"]
    assert "stream" in message and "not supported" not in message


def test_lines_split_on_newlines_only(client):
    """U+2028 inside a string and a byte order mark are text, not line breaks (JSONL)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "one\u2028two\u0085"}],
            "max_tokens": 2}
    data = b"\xef\xbb\xbf" + json.dumps(_line("u", body), ensure_ascii=False).encode() + b"\n"
    upload = client.files.create(file=("u.jsonl", data), purpose="batch")
    batch = _wait(client, client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                                completion_window="24h").id)
    assert batch.status == "completed" and batch.request_counts.completed == 1


def test_file_listing_pages_newest_first(client):
    ids = [client.files.create(file=_jsonl([_line(str(i), {})]), purpose="batch").id
           for i in range(3)]
    page = client.files.list(purpose="batch", limit=2)
    assert [f.id for f in page.data] == ids[::-1][:2] and page.has_more
    rest = client.files.list(purpose="batch", limit=2, after=page.data[-1].id)
    assert rest.data[0].id == ids[0]
    oldest = client.files.list(purpose="batch", order="asc", limit=1)
    assert oldest.data[0].created_at <= page.data[0].created_at


def test_cancel_stops_the_requests(client):
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    upload = client.files.create(file=_jsonl([_line(f"r{i}", body) for i in range(8)]),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                  completion_window="24h")
    time.sleep(1.0)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = _wait(client, batch.id, timeout=60)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert batch.request_counts.completed < 8
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)
    # The aborted requests freed the engine: a new one is answered at once.
    t0 = time.monotonic()
    reply = client.chat.completions.create(model="m", max_tokens=4, messages=[
        {"role": "user", "content": "Hi"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert time.monotonic() - t0 < 30


def test_a_full_queue_makes_a_line_wait_not_fail(monkeypatch):
    """A line the engine refuses with 429 (--max-queued-requests) is sent again until taken."""
    import asyncio

    from radixlm.entrypoints.openai import batches

    answers = iter([(429, {"error": "full"}), (429, {"error": "full"}), (200, {"id": "x"})])
    calls = []

    async def once(app, endpoint, line):
        calls.append(line.custom_id)
        return next(answers)

    monkeypatch.setattr(batches, "_answer_once", once)
    line = batches.BatchLine("c", {"model": "m"})
    assert asyncio.run(batches._answer(None, CHAT, line)) == (200, {"id": "x"})
    assert calls == ["c", "c", "c"]


def test_too_many_lines_fail_before_any_is_parsed(monkeypatch):
    from radixlm.entrypoints.openai import batches
    monkeypatch.setattr(batches, "MAX_LINES", 2)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    data = _jsonl([_line(str(i), body) for i in range(3)]).getvalue()
    parsed = []
    monkeypatch.setattr(batches, "_parse_line", lambda *a: parsed.append(a))
    lines, errors = batches.parse_input(data + b"\n\n", CHAT)
    assert lines == [] and parsed == []
    assert "3 requests; at most 2" in errors[0].record()["message"]
