"""Error answers of tandem's own routes, in vLLM's shape, with ``param`` filled.

vLLM answers every error as ``{"error": {"message", "type", "param", "code"}}``; its
validation errors fill ``param`` with the field's place in the request (``body.world_size``,
``body.params.0.shape``), but an ``HTTPException`` raised by a route gets ``param: null``.
So tandem's own refusals (``rank: 3 must be < world_size 2``, ``backend: 'nccl' cannot
run ...``) said the field only in their text. A :class:`RouteError` carries it, and
:func:`install_route_errors` answers it with ``param`` in the validation errors' form; a refusal that
no field causes (no weight group yet, a stuck worker) keeps ``param`` null.

A request the routes' pydantic bodies refuse is answered in the same shape, 400, its
message one readable line per field (``master_addr: field required``) where vLLM's
handler wrote each error's Python repr (``{'type': 'missing', 'loc': ...}``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_REPORTED_ERRORS = 10  # a body failing per element would list every element


def param_of(field: str | None) -> str | None:
    """A request field as vLLM's validation errors name it: ``params[3].shape`` ->
    ``body.params.3.shape``; None stays None."""
    if field is None:
        return None
    return "body." + re.sub(r"\[(\d+)\]", r".\1", field)


class RouteError(HTTPException):
    """A refusal of one of tandem's routes; ``field``: the request field at fault, if any."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(status, detail)
        self.param = param_of(field)


async def answer(request: Request, err: Exception) -> JSONResponse:
    """``err`` (a :class:`RouteError`) as vLLM's ``ErrorResponse``, ``param`` filled."""
    assert isinstance(err, RouteError)
    return _error_response(err.status_code, str(err.detail), err.param)


def _error_response(status: int, message: str, param: str | None) -> JSONResponse:
    error = {
        "message": message,
        "type": HTTPStatus(status).phrase,
        "param": param,
        "code": status,
    }
    return JSONResponse({"error": error}, status_code=status)


def field_of(error: dict[str, Any]) -> str:
    """A validation error's field as tandem's refusals name it: ``('body', 'params', 0,
    'shape')`` -> ``params[0].shape``; ``body`` for the body as a whole (absent, not JSON)."""
    where, *rest = error.get("loc") or ("body",)
    if where != "body":  # a query or path parameter
        rest = [where, *rest]
    if not rest or error.get("type") == "json_invalid":
        return "body"
    field = ""
    for part in rest:
        field += f"[{part}]" if isinstance(part, int) else f".{part}"
    return field.lstrip(".")


def readable(errors: Sequence[dict[str, Any]]) -> str:
    """``master_addr: field required; rank: input should be greater than or equal to 1``:
    pydantic's message for each field, never the value it refused."""
    said = []
    for error in errors[:MAX_REPORTED_ERRORS]:
        message = str(error.get("msg", "invalid"))
        said.append(f"{field_of(error)}: {message[:1].lower()}{message[1:]}")
    more = len(errors) - MAX_REPORTED_ERRORS
    return "; ".join(said) + (f"; and {more} more" if more > 0 else "")


async def answer_invalid(request: Request, err: Exception) -> JSONResponse:
    """A body the route's model refused (a :class:`RequestValidationError`): 400, vLLM's
    shape, its message :func:`readable`, ``param`` the first field at fault."""
    assert isinstance(err, RequestValidationError)
    errors = err.errors()
    param = _param_of_error(errors[0]) if errors else None
    return _error_response(400, readable(errors) or "invalid request", param)


def _param_of_error(error: dict[str, Any]) -> str:
    """``body.params.0.shape`` (vLLM's form: the error's place, dotted)."""
    if field_of(error) == "body":
        return "body"
    return ".".join(str(part) for part in error.get("loc", ()))


def install_route_errors(app: FastAPI, own_paths: Collection[str] | None = None) -> None:
    """Answer :class:`RouteError` with its ``param`` (before vLLM's ``HTTPException``
    handler, which would leave it null: Starlette picks the most specific class), and a
    body refused on one of ``own_paths`` (None: every path) with :func:`answer_invalid`;
    other paths keep the handler the app had (vLLM's)."""
    app.add_exception_handler(RouteError, answer)
    others = app.exception_handlers.get(
        RequestValidationError, request_validation_exception_handler
    )

    async def invalid(request: Request, err: Exception) -> Any:
        if own_paths is not None and request.url.path not in own_paths:
            return await others(request, err)
        return await answer_invalid(request, err)

    app.add_exception_handler(RequestValidationError, invalid)
