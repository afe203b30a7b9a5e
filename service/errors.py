"""Errors of the API, each with a contract code and an HTTP status; one handler renders them.

```
ServiceError                   (code, status_code, message, hint, details, headers)
├── InvalidRequest             invalid_request   400
├── UploadTooLarge             upload_too_large  413
├── Unauthorized               unauthorized      401  (WWW-Authenticate: Bearer)
├── Forbidden                  forbidden         403
├── NotFound                   not_found         404
├── Conflict                   conflict          409  (the job's state does not allow it)
├── Expired                    expired           410  (the job's files are gone)
├── StorageQuotaExceeded       storage_quota_exceeded 413  (the key holds too much)
├── RateLimited                rate_limited      429  (Retry-After)
└── InternalError              internal_error    500  — a bug of ours
```
FastAPI's request validation errors, Starlette's HTTP errors and unexpected exceptions are
mapped onto these in `as_service_error`, and `render_error` is the one handler: every answer
that is not a success is a `schemas.ErrorBody`.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas import ErrorBody
from schemas.outcomes import CATALOGUE, validation_items

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of every error the API answers with."""

    code: ClassVar[str] = "internal_error"
    status_code: ClassVar[int] = 500
    """From the catalogue (`schemas.outcomes`): set for each subclass by its `code`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        status = CATALOGUE[cls.code].http_status
        if status is None:
            raise TypeError(f"{cls.code!r} is not an API answer in the catalogue")
        cls.status_code = status

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}
        self.headers = headers or {}
        self.http_status: int | None = None

    def body(self) -> ErrorBody:
        """The contract's error body for this error."""
        return ErrorBody.model_validate(
            {"code": self.code, "message": self.message, "hint": self.hint, "details": self.details}
        )


class InvalidRequest(ServiceError):
    code = "invalid_request"


class UploadTooLarge(ServiceError):
    code = "upload_too_large"


class Unauthorized(ServiceError):
    code = "unauthorized"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("WWW-Authenticate", "Bearer")


class Forbidden(ServiceError):
    code = "forbidden"


class NotFound(ServiceError):
    code = "not_found"


class Conflict(ServiceError):
    code = "conflict"


class Expired(ServiceError):
    code = "expired"


class StorageQuotaExceeded(ServiceError):
    code = "storage_quota_exceeded"


class RateLimited(ServiceError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.details.setdefault("retry_after_s", round(retry_after_s, 3))
        self.headers["Retry-After"] = str(max(1, int(retry_after_s + 0.999)))


class InternalError(ServiceError):
    code = "internal_error"


ERROR_CLASSES: tuple[type[ServiceError], ...] = (
    InvalidRequest,
    UploadTooLarge,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    Expired,
    StorageQuotaExceeded,
    RateLimited,
    InternalError,
)

_STATUS_TO_ERROR: dict[int, type[ServiceError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: InvalidRequest,
    406: InvalidRequest,
    409: Conflict,
    411: InvalidRequest,
    413: UploadTooLarge,
    415: InvalidRequest,
    416: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
}


def error_responses(*classes: type[ServiceError]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for endpoints that may raise these errors (codes of one status
    share its entry)."""
    codes: dict[int, list[str]] = {}
    for cls in classes:
        codes.setdefault(cls.status_code, []).append(f"`{cls.code}`")
    return {
        status: {"model": ErrorBody, "description": ", ".join(names)}
        for status, names in codes.items()
    }


def as_service_error(exc: Exception) -> ServiceError:
    """The one place foreign exceptions become ours: FastAPI validation errors, Starlette
    HTTP errors (404 of unknown routes, 405, …) and anything unexpected (a bug)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, RequestValidationError):
        items = validation_items(exc.errors())
        fields = ", ".join(item["field"] for item in items if item["field"])
        return InvalidRequest(f"invalid request: {fields or 'body'}", details={"errors": items})
    if isinstance(exc, StarletteHTTPException):
        cls = _STATUS_TO_ERROR.get(exc.status_code)
        if cls is None:
            cls = InternalError if exc.status_code >= 500 else InvalidRequest
        if cls is RateLimited:
            return RateLimited(str(exc.detail), retry_after_s=1.0)
        error = cls(str(exc.detail), headers=dict(exc.headers or {}))
        error.http_status = exc.status_code
        return error
    return InternalError(
        "internal error: this is a bug in torchport, please report it",
        details={"type": type(exc).__name__},
    )


async def render_error(request: Request, exc: Exception) -> JSONResponse:
    """The exception handler: every failure as the contract's error body and its status."""
    error = as_service_error(exc)
    if isinstance(error, InternalError) and error is not exc:
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        status_code=error.http_status or error.status_code,
        content=error.body().model_dump(mode="json"),
        headers=error.headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Render every failure of `app` with `render_error` (registered per base class only
    because Starlette picks handlers by exception type)."""
    for exc_class in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_class, render_error)
