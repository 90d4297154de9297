"""``retrieve_future``: Tinker's long-poll for the result of submitted work.

The SDK re-polls at once after each ``try_again``, so the server holds the request for up
to ``LONG_POLL_S`` (under the client's 45 s timeout) before answering it. A result that SDK
0.38 reads as protobuf (a ``ProtoResult``) goes out as protobuf when the request's Accept
header asks for it, else as JSON; a failure is a JSON ``{error, category}`` with a
lowercase category, answered with 200 as the SDK expects (also when only the store
remembers it). A future lost to a restart answers 410, which the SDK does not retry.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from twinkle.server.futures import RecordedFailure, _error_body
from twinkle.server.routes.common import caller, field, json_body, state_of
from twinkle.server.tinker.results import PROTO_MEDIA_TYPE, ProtoResult, json_safe, wants_proto

router = APIRouter()
LONG_POLL_S = 25.0


@router.post("/retrieve_future")
async def retrieve_future(request: Request) -> Response:
    principal = caller(request)
    body = await json_body(request)
    request_id = field(body, "request_id", str)
    state = state_of(request)
    try:
        future = await state.futures.poll(principal.key_id, request_id, LONG_POLL_S)
    except RecordedFailure as failure:
        return JSONResponse(failure.body())
    if future is None:
        return JSONResponse(
            {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        )
    error = future.exception()
    if error is not None:
        return JSONResponse(_error_body(error))
    result = future.result()
    if isinstance(result, ProtoResult):
        if wants_proto(request.headers.get("accept")):
            return Response(content=result.proto, media_type=PROTO_MEDIA_TYPE)
        return JSONResponse(json_safe(result.json))
    return JSONResponse(json_safe(result) if result is not None else {})
