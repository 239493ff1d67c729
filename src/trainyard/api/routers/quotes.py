"""/v1/quotes: price a spec on the live pools (and the packaged catalog) without submitting it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import ErrorEnvelope, QuoteRequest, QuoteResponse
from trainyard.services.quoting import cost_quote, option_document, quote_pools

router = APIRouter(prefix="/v1/quotes", tags=["quotes"])


@router.post(
    "",
    response_model=QuoteResponse,
    responses={401: {"model": ErrorEnvelope}, 413: {"model": ErrorEnvelope}, 422: {"model": ErrorEnvelope}},
    summary="Quote a job spec: every option ranked, infeasible ones with their reason",
)
def create_quote(body: QuoteRequest, request: Request, _principal: CurrentPrincipal) -> JSONResponse:
    platform: Any = request.app.state.platform
    live = body.pools if body.pools is not None else platform.pools.pools()
    pools = quote_pools(live, with_catalog=body.include_catalog and platform.options.with_catalog)
    quoter = platform.options.quoter or cost_quote
    options = quoter(body.spec, pools)
    return JSONResponse({"options": [option_document(o) for o in options]})
