"""The base of every API document: a pydantic model that also reads like the JSON it came from."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Document(BaseModel):
    """A response document of the REST API.

    Fields are attributes (``job.state``). For scripts written against the JSON, a document is also a
    read-only mapping of the fields the server sent, like the dict it came from: iterating it yields
    their names (``set(doc)``, ``list(doc)``, ``dict(doc)``, ``len(doc)``), and it answers
    ``doc["state"]``, ``doc.get("reason")``, ``"result" in doc``, ``keys()``, ``values()`` and
    ``items()``; ``isinstance(doc, collections.abc.Mapping)`` holds. (A plain pydantic model iterates
    as ``(name, value)`` pairs instead; ``items()`` gives those.) Values stay typed (``doc["placement"]``
    is a document too); :meth:`to_dict` gives back exactly the JSON the server sent. A field the model
    declares but the server left out reads as its default through ``doc[name]`` and ``doc.name``, and
    is not among the keys. Fields a newer server adds are kept (``extra="allow"``). Schemas are built on
    first use, so importing the models costs little.
    """

    model_config = ConfigDict(extra="allow", defer_build=True, protected_namespaces=())

    def _has(self, key: str) -> bool:
        return key in type(self).model_fields or key in (self.__pydantic_extra__ or {})

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or not self._has(key):
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (
            key in self.model_fields_set or key in (self.__pydantic_extra__ or {})
        )

    def get(self, key: str, default: Any = None) -> Any:
        """``doc[key]`` when the document has that field, else ``default``."""
        return self[key] if self._has(key) else default

    def _sent(self) -> list[str]:
        sent = self.model_fields_set
        return [k for k in type(self).model_fields if k in sent] + list(self.__pydantic_extra__ or {})

    def keys(self) -> list[str]:
        """The names of the fields the server sent, in document order."""
        return self._sent()

    def values(self) -> list[Any]:
        """The values of the fields the server sent, in document order."""
        return [self[k] for k in self._sent()]

    def items(self) -> list[tuple[str, Any]]:
        """``(name, value)`` of every field the server sent, in document order."""
        return [(k, self[k]) for k in self._sent()]

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        """The names of the fields the server sent, as a dict's keys (not pydantic's pairs)."""
        return iter(self._sent())

    def __len__(self) -> int:
        return len(self._sent())

    def to_dict(self) -> dict[str, Any]:
        """The document as plain JSON data, with exactly the fields the server sent."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_dict() == {k: _plain(v) for k, v in other.items()}
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


Mapping.register(Document)


class ErrorBody(Document):
    code: str = Field(examples=["not_found"])
    message: str = Field(examples=["no job 'job-0123456789ab'"])
    hint: str | None = Field(None, examples=["List your jobs with `trainyard jobs list`."])
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorEnvelope(Document):
    error: ErrorBody
