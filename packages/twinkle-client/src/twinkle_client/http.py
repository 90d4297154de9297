"""The HTTP layer: the API key on every request, retries that are safe to repeat.

Every non-GET request carries an ``X-Idempotency-Key``, the same on each retry, so the
server runs the work once however many times the request is sent. Connection failures,
408, 429, 502, 503 and 504 are retried with exponential backoff; other errors raise the
typed error at once.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, BinaryIO

import httpx

from twinkle_client.errors import ConnectionFailed, from_response

RETRY_STATUSES = {408, 429, 502, 503, 504}


class Transport:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 660.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff = backoff
        self._http = http_client or httpx.Client(timeout=timeout)
        self._headers = {"X-API-Key": api_key}

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        retries: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``timeout`` (seconds) replaces the client's for this request only."""
        headers = dict(self._headers)
        if method != "GET":
            headers["X-Idempotency-Key"] = uuid.uuid4().hex
        url = f"{self.base_url}/api/v1{path}"
        attempts = 1 + (self.max_retries if retries is None else retries)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(
                    method,
                    url,
                    json=body,
                    params=params,
                    headers=headers,
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
            except httpx.TransportError as exc:
                if last:
                    raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}") from exc
                time.sleep(self.backoff * 2**attempt)
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(_retry_after(response) or self.backoff * 2**attempt)
                continue
            payload = _json_or_text(response)
            if response.status_code >= 400:
                raise from_response(response.status_code, payload)
            return payload
        raise AssertionError("unreachable")

    def download(self, path: str, target: BinaryIO, chunk: int = 1024 * 1024) -> None:
        """GET a route's bytes into ``target``, following its redirect (a signed link); a
        4xx or 5xx raises the typed error before anything is written."""
        url = f"{self.base_url}/api/v1{path}"
        with self._http.stream("GET", url, headers=self._headers, follow_redirects=True) as answer:
            if answer.status_code >= 400:
                answer.read()
                raise from_response(answer.status_code, _json_or_text(answer))
            for block in answer.iter_bytes(chunk):
                target.write(block)

    def upload(self, path: str, content: bytes, params: dict[str, Any], media_type: str) -> Any:
        """POST raw bytes (an archive) once; the answer's JSON."""
        headers = {**self._headers, "X-Idempotency-Key": uuid.uuid4().hex}
        headers["Content-Type"] = media_type
        url = f"{self.base_url}/api/v1{path}"
        try:
            answer = self._http.post(url, content=content, params=params, headers=headers)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach {self.base_url}: {exc}") from exc
        if answer.status_code >= 400:
            raise from_response(answer.status_code, _json_or_text(answer))
        return answer.json()

    def close(self) -> None:
        self._http.close()


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"error": response.text[:200]}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(float(value), 30.0) if value is not None else None
    except ValueError:
        return None
