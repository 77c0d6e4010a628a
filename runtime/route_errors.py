"""Error answers of tandem's own routes, in vLLM's shape, with ``param`` filled.

vLLM answers every error as ``{"error": {"message", "type", "param", "code"}}``; its
validation errors fill ``param`` with the field's place in the request (``body.world_size``,
``body.params.0.shape``), but an ``HTTPException`` raised by a route gets ``param: null``.
So tandem's own refusals (``rank: 3 must be < world_size 2``, ``backend: 'nccl' cannot
run ...``) said the field only in their text. A :class:`RouteError` carries it, and
:func:`install_route_errors` answers it with ``param`` in the validation errors' form; a refusal that
no field causes (no weight group yet, a stuck worker) keeps ``param`` null.
"""

from __future__ import annotations

import re
from http import HTTPStatus

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse


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
    error = {
        "message": str(err.detail),
        "type": HTTPStatus(err.status_code).phrase,
        "param": err.param,
        "code": err.status_code,
    }
    return JSONResponse({"error": error}, status_code=err.status_code)


def install_route_errors(app: FastAPI) -> None:
    """Answer :class:`RouteError` with its ``param`` (before vLLM's ``HTTPException``
    handler, which would leave it null: Starlette picks the most specific class)."""
    app.add_exception_handler(RouteError, answer)
