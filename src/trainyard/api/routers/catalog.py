"""/v1/catalog: the packaged accelerator table and cloud offers."""

from __future__ import annotations

from dataclasses import asdict
from functools import cache
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from trainyard.api.auth import CurrentPrincipal
from trainyard.api.schemas import AcceleratorList, ErrorEnvelope

router = APIRouter(prefix="/v1/catalog", tags=["catalog"])


@cache
def _accelerators() -> list[dict[str, Any]]:
    from trainyard.catalog.accelerators import load_accelerators

    out = []
    for a in load_accelerators().values():
        d = asdict(a)
        d["notes"] = list(d.get("notes") or [])
        out.append(d)
    return out


@cache
def _offer_pools() -> list[dict[str, Any]]:
    from trainyard.services.quoting import catalog_pools

    return [p.model_dump(mode="json", exclude_none=True) for p in catalog_pools()]


@router.get(
    "",
    response_model=AcceleratorList,
    responses={401: {"model": ErrorEnvelope}},
    summary="Accelerators known to the catalog",
)
def catalog(_p: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"accelerators": _accelerators()})


@router.get(
    "/accelerators",
    response_model=AcceleratorList,
    responses={401: {"model": ErrorEnvelope}},
    summary="Accelerators known to the catalog",
)
def accelerators(_p: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"accelerators": _accelerators()})


@router.get(
    "/offers",
    responses={401: {"model": ErrorEnvelope}},
    summary="Cloud offers of the packaged catalog, as pools",
)
def offers(_p: CurrentPrincipal) -> JSONResponse:
    return JSONResponse({"pools": _offer_pools()})
