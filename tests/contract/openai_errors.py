"""The OpenAI API's error responses, shared by the Responses and Chat Completions cases."""

from __future__ import annotations

import httpx

ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


def openai_error_response(status: int, request_id: str) -> httpx.Response:
    """A real error body and headers for `status`; 429 carries Retry-After 7 s."""
    kind, code = ERRORS[status]
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if status == 429:
        headers |= {
            "retry-after": "7",
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "7s",
        }
    body = {"message": f"simulated failure {status}", "type": kind, "param": None, "code": code}
    return httpx.Response(status, headers=headers, json={"error": body})
