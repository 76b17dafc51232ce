"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "code", "param"}}``.

FastAPI's own errors (422 validation, 404/405 routing, body parsing) are mapped into the same
shape; request validation becomes 400, as OpenAI does. Messages never show server paths: any
path inside the voices directory is replaced by ``<voices>/...`` (:func:`public_message`).
"""

from __future__ import annotations

import json
import logging
import os
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

#: status -> (OpenAI error type, default code)
_TYPES = {
    400: ("invalid_request_error", "invalid_value"),
    401: ("authentication_error", "unauthorized"),
    403: ("permission_error", "forbidden"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "payload_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "queue_full"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "not_ready"),
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error response (OpenAI's shape)."""

    error: ErrorDetail


#: OpenAPI ``responses=`` entry documenting the error statuses a route can return
ERROR_RESPONSES = {
    status: {"model": ErrorResponse, "description": desc}
    for status, desc in [
        (400, "Invalid request (validation)"),
        (404, "Unknown voice or endpoint"),
        (413, "Request body or upload too large"),
        (415, "Wrong content type"),
        (429, "Queue full; see Retry-After"),
        (500, "Internal error"),
        (503, "Model not loaded yet, or shutting down"),
    ]
}


class ApiError(Exception):
    """An error answered to the client as OpenAI-style JSON."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _TYPES.get(status, ("server_error", "error"))[1]
        self.param = param
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    etype, default_code = _TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                              "error"))
    return {"error": {"message": message, "type": etype, "code": code or default_code, "param": param}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def _loc_name(loc) -> str:
    """'voice' for ('body', 'voice', 'constrained-str'): the field path without union-member tags."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    keep = parts[:1] + [p for p in parts[1:] if p.isidentifier() and not p[:1].isupper() and p not in _TAGS]
    return ".".join(keep)


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "constrained-str"}


BODY_FIX = "send a JSON object with Content-Type: application/json"
#: FastAPI's 400 detail when decoding the body raised something other than a JSON syntax error
PARSE_FAILED = "There was an error parsing the body"


def body_message(why: str) -> str:
    """Every problem with the body as a whole reads the same: what is wrong, then the fix."""
    return f"the request body {why}; {BODY_FIX}"


def parse_failure(cause: BaseException | None) -> str:
    """:data:`PARSE_FAILED` in words: why the body could not be decoded (FastAPI chains the cause)."""
    if isinstance(cause, UnicodeDecodeError):
        return body_message(f"is not valid JSON (not UTF-8 text: byte {cause.start})")
    if isinstance(cause, RecursionError):
        return body_message("nests arrays or objects too deeply")
    return body_message("is not valid JSON")


def _whole_body(err: dict) -> str | None:
    """The message of an error about the body as a whole (loc ``("body",)``), else None."""
    if tuple(err.get("loc", ())) != ("body",):
        return None
    if err.get("type") == "missing":
        return body_message("is empty")
    value = err.get("input")
    kind = {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(type(value), "a number")
    return body_message(f"is {kind}, not a JSON object")


def validation_message(errors) -> tuple[str, str | None]:
    """Turn pydantic/FastAPI errors into one readable sentence and the first offending field.

    One message per field (a union such as ``voice`` fails once per member; the first says it).
    """
    msgs, first, seen = [], None, set()
    for err in errors:
        kind = err.get("type", "")
        whole = _whole_body(err)
        if whole is not None:
            return whole, None
        name = "" if kind == "json_invalid" else _loc_name(err.get("loc", ()))
        top = name.split(".")[0]
        if top in seen and kind != "extra_forbidden":
            continue
        seen.add(top)
        first = first or name or None
        if kind == "json_invalid":
            why = (err.get("ctx") or {}).get("error")
            msgs.append(body_message(f"is not valid JSON ({why} at character {err['loc'][-1]})" if why and
                                     len(err.get("loc", ())) > 1 else "is not valid JSON"))
        elif kind == "extra_forbidden":
            msgs.append(f"unknown field '{name}'; remove it (see /openapi.json for the accepted fields)")
        elif kind == "missing":
            msgs.append(f"'{name}' is required")
        else:
            msgs.append(f"{name}: {err.get('msg', 'invalid value')}" if name else err.get("msg", "invalid"))
        if len(msgs) == 5:
            break
    return "; ".join(msgs) or "invalid request", first


#: library words -> HTTP words: model sizes as users spell them, request fields for keywords
_HTTP_WORDS = (("0b6", "0.6b"), ("1b7", "1.7b"), ("speaker=<", "'voice' <"), ("instruct=...", "'instructions'"),
               ("voice=<Voice or .voice file>", "'voice' (an uploaded voice: POST /v1/voices with the reference "
                "clip as 'file' and its transcript as 'ref_text')"),
               ("instruct=<a description of the voice>", "'instructions' (a description of the voice)"))


def http_words(message: str) -> str:
    """A library message in the words of this API (field names, not CLI flags or keywords)."""
    for lib, http in _HTTP_WORDS:
        message = message.replace(lib, http)
    return message


def public_message(message: str, directory: str | None) -> str:
    """``message`` with every path under ``directory`` (the voices directory) shortened to
    ``<voices>/...``, so error bodies never reveal where the server keeps its files; library words
    become HTTP words (:func:`http_words`)."""
    message = http_words(message)
    if not directory:
        return message
    sep = re.escape(os.sep)
    pattern = re.escape(directory.rstrip(os.sep)) + rf"(?:{sep}[^\s'\"]*|(?![^\s'\"(),;:.]))"
    return re.sub(pattern, "<voices>/...", message)


#: words of a speech request's error message -> the field it is about (the first one named wins)
_PARAM_WORDS = (("language", "language"), ("speaker", "voice"), ("voice", "voice"), ("instruct", "instructions"))


def named_param(message: str) -> str | None:
    """The speech request field an engine message names first (``unknown language 'xx'`` -> language),
    for errors raised where the field was not known (the library's InputError); else None."""
    found = [(message.find(word), param) for word, param in _PARAM_WORDS if word in message]
    return min(found)[1] if found else None


def _voices_dir(request: Request) -> str | None:
    state = getattr(request.app.state, "qtts", None)
    return getattr(getattr(state, "store", None), "directory", None)


_REST = ((re.compile(r"``([^`]+)``"), r"`\1`"), (re.compile(r":\w+:`~?(?:[\w.]+\.)?([^`.]+)`"), r"`\1`"))
#: error statuses a route cannot answer without a body (too large, wrong type), or without any input
_BODY_ONLY, _INPUT_ONLY = ("413", "415"), ("400", "404")


def markdown(text: str) -> str:
    """A route docstring (reST: ````x````, ``:func:`x```) as the Markdown the /docs page renders."""
    for pattern, repl in _REST:
        text = pattern.sub(repl, text)
    return text


def tidy_openapi(spec: dict) -> dict:
    """The schema as this server answers: no 422 (validation errors are 400 here), no 413/415 on a
    route without a body, no 400/404 on one without any input; descriptions in Markdown."""
    for ops in spec.get("paths", {}).values():
        for op in ops.values():
            drop = {"422"}
            if "requestBody" not in op:
                drop.update(_BODY_ONLY if op.get("parameters") else _BODY_ONLY + _INPUT_ONLY)
            for status in drop:
                op.get("responses", {}).pop(status, None)
            if "description" in op:
                op["description"] = markdown(op["description"])
    schemas = spec.get("components", {}).get("schemas", {})
    for schema in schemas.values():
        for item in (schema, *schema.get("properties", {}).values()):
            if isinstance(item.get("description"), str):
                item["description"] = markdown(item["description"])
    if "HTTPValidationError" not in json.dumps(spec.get("paths", {})):
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
    return spec


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-style errors for every failure, and an OpenAPI schema that lists the ones each route answers."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            tidy_openapi(build())  # FastAPI caches the schema it builds; this edits it once
        return app.openapi_schema

    app.openapi = openapi

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        message = public_message(exc.message, _voices_dir(request))
        param = exc.param
        if param is None and exc.status < 500 and request.url.path.startswith("/v1/audio/speech"):
            param = named_param(message)
        return error_response(exc.status, message, exc.code, param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error_response(400, message, "invalid_value", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        status = exc.status_code
        if status == 404:
            path = request.url.path
            hint = " (no trailing slash)" if path.endswith("/") and len(path) > 1 else ""
            message = f"no such endpoint: {request.method} {path}{hint}; see /openapi.json"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        elif status == 400 and exc.detail == PARSE_FAILED:
            message = parse_failure(exc.__cause__)
        else:
            message = str(exc.detail)
        return error_response(status, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal server error; the server log has the details")
