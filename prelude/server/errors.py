"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import orjson
from starlette.responses import Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
          503: "server_error"}


class APIError(Exception):
    """A request the server refuses; raised anywhere in a handler, rendered by the app."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(orjson.dumps(self.body()), status_code=self.status, headers=self.headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def context_too_long(message: str, param: str | None) -> APIError:
    """A request past the model's context: a 400 with OpenAI's code for it, which clients map
    to their own error (LangChain's ContextOverflowError)."""
    return APIError(400, message, param, "context_length_exceeded")


def model_not_found(model: str) -> APIError:
    """OpenAI's answer to a model it does not serve (a request's `model`, models.retrieve)."""
    return APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")
