"""The gateway's refusals: OpenAI's error object with the HTTP status an OpenAI client maps to its exceptions."""

from __future__ import annotations

from http import HTTPStatus
from typing import Optional


class ApiError(Exception):
    """A refused request: its HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = int(status), message, type, param, code
        self.headers = headers

    def payload(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> ApiError:
    return ApiError(HTTPStatus.BAD_REQUEST, message, param=param, code=code)
