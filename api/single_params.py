"""A query parameter that takes one value, given more than once, is a 400 naming it.

FastAPI keeps the last of `?stat=count&stat=p99` silently, so the answer would be for a stat the
caller may not have meant (several stats at once are a websocket subscription's, docs/websocket.md).
Parameters declared as lists (`group_by`, `filter`) take repeats, as documented. Installed as a
dependency of the whole app, so every route, present and future, follows one rule."""

from __future__ import annotations

import types
import typing

from starlette.requests import HTTPConnection

from api.errors import bad_request

_SEQUENCES = (list, set, frozenset, tuple)


def _takes_many(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    if origin in _SEQUENCES or annotation in _SEQUENCES:
        return True
    if origin in (typing.Union, types.UnionType):  # `list[str] | None`
        return any(_takes_many(a) for a in typing.get_args(annotation))
    return False


def _single_valued(route: object) -> tuple[str, ...]:
    """The aliases of the route's query parameters that take one value (kept on the route)."""
    names = getattr(route, "_sketchboard_single_params", None)
    if names is None:
        names = tuple(dict.fromkeys(p.alias for p in _query_params(getattr(route, "dependant", None))
                                    if not _takes_many(p.field_info.annotation)))
        try:
            route._sketchboard_single_params = names
        except AttributeError:
            pass
    return names


def _query_params(dependant: object) -> list:
    """The query parameters of a route's dependant and of its dependencies'."""
    if dependant is None:
        return []
    out = list(dependant.query_params)
    for sub in dependant.dependencies:
        out += _query_params(sub)
    return out


async def no_repeated_single_params(connection: HTTPConnection) -> None:
    if connection.scope.get("type") != "http":
        return  # a websocket's handshake parameters are read by its own route
    query = connection.query_params
    if len(query.multi_items()) == len(query):
        return  # no name given twice: the common case, no route looked at
    for name in _single_valued(connection.scope.get("route")):
        given = query.getlist(name)
        if len(given) > 1:
            also = " (several stats at once: a websocket subscription, docs/websocket.md)" if name == "stat" else ""
            raise bad_request(name, f"{name!r} given {len(given)} times; it takes one value{also}")
