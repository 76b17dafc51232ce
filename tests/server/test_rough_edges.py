"""Rough edges a new user met in the HTTP server (issue 37): SSE usage, error messages, /docs."""

from __future__ import annotations

import json

import httpx
import pytest

import qtts
from support.server_util import start_server


@pytest.fixture(scope="module")
def cv(tiny_snapshot):
    """A CustomVoice server on the real tiny engine."""
    engine = qtts.load(tiny_snapshot(kind="custom_voice"), threads=1)
    srv, app = start_server(engine, max_frames=16, chunk_frames=4)
    srv.engine, srv.app = engine, app
    yield srv
    srv.stop()


def test_sse_done_counts_the_input_tokens(cv):
    text = "Count these tokens, please."
    body = {"model": "qtts", "input": text, "voice": "vivian", "max_frames": 4, "stream_format": "sse",
            "response_format": "pcm"}  # fmt: skip
    r = httpx.post(cv.url + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    done = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")][-1]
    expected = len(cv.engine.components.tokenizer.encode(text))
    assert expected > 0 and done["type"] == "speech.audio.done"
    assert done["usage"] == {"input_tokens": expected, "output_tokens": 4, "total_tokens": expected + 4}


def _speech(srv, **kw) -> httpx.Response:
    return httpx.post(srv.url + "/v1/audio/speech", timeout=120, **kw)


@pytest.mark.parametrize("body,why", [
    (b"[" * 5000 + b"]" * 5000, "nests arrays or objects too deeply"),
    (b'{"input": "caf\xe9"}', "not UTF-8 text"),
    (b'{"input": ', "is not valid JSON"),
    (b"[1, 2]", "is an array, not a JSON object"),
    (b"null", "is null, not a JSON object"),
    (b"", "is empty"),
])  # fmt: skip
def test_body_errors_read_alike(cv, body, why):
    r = _speech(cv, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    message = error["message"]
    assert message.startswith("the request body ") and why in message, message
    assert message.endswith("send a JSON object with Content-Type: application/json")
    assert error["param"] is None


def test_param_names_the_field_the_message_is_about(cv):
    r = _speech(cv, json={"model": "qtts", "input": "Hi.", "voice": "vivian", "language": "klingon"})
    assert r.status_code == 400 and "language" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "language"


def test_openapi_lists_what_each_route_answers_in_markdown(cv):
    spec = httpx.get(cv.url + "/openapi.json", timeout=30).json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            statuses = set(op["responses"])
            assert "422" not in statuses, (method, path)  # validation errors are 400 here
            if "requestBody" not in op:
                assert not statuses & {"413", "415"}, (method, path)
            assert "``" not in op.get("description", "") and ":func:`" not in op.get("description", "")
    speech = spec["paths"]["/v1/audio/speech"]["post"]
    assert {"400", "404", "413", "415", "429"} <= set(speech["responses"])
    assert "`input`" in speech["description"]
    assert "``" not in json.dumps(spec["components"])
