"""What every spec section shares: :class:`SpecError`, the strict base model that refuses
unknown keys and numbers written as strings, the YAML 1.2 loader, and a store URL's scheme."""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationInfo,
    field_validator,
)

#: the URL schemes of the local filesystem (a plain path has the first): a release is written to
#: a staging directory renamed into place; every other scheme is written in place under a claim.
#: The one list of them: the engine's store registry (:mod:`mvg_dask.engine.store`) gives each
#: its local entry and every other scheme an entry of its own (see docs/howto/object-storage.md)
LOCAL_SCHEMES = ("file",)


def url_scheme(store: str) -> str:
    """The scheme of a store's URL as written, parsed without fsspec: ``file`` for a plain path;
    for a chained URL its chain (``simplecache::s3``, ``simplecache::file`` for a chain ending in
    a plain path)."""
    if "://" in store:
        return store.split("://", 1)[0]
    if "::" in store:
        return f"{store.rsplit('::', 1)[0]}::{LOCAL_SCHEMES[0]}"
    return LOCAL_SCHEMES[0]


def is_local(store: str) -> bool:
    """True for a plain path or a ``file://`` URL (a scheme of :data:`LOCAL_SCHEMES`)."""
    return url_scheme(store) in LOCAL_SCHEMES


class SpecError(ValueError):
    """A release spec is invalid; the message names the field and the remedy."""


def _takes_a_number_only(annotation: object) -> bool:
    """True for a field whose values are numbers (or lists of numbers) and never strings."""
    seen: list[object] = []

    def walk(a: object) -> None:
        seen.append(a)
        for arg in typing.get_args(a):
            walk(arg)

    walk(annotation)
    numeric = any(a in (float, int) for a in seen)
    textual = any(a is str or typing.get_origin(a) is Literal for a in seen)
    return numeric and not textual


def _first_string(value: object) -> str | None:
    """``value`` if it is a string, else the first string of a list or tuple (or ``None``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return next((v for v in value if isinstance(v, str)), None)
    return None


def _reads_as_a_number(text: str) -> bool:
    """Whether ``text``, written unquoted in a spec, would be a number (so a string holding it
    was quoted)."""
    tag = SpecLoader("").resolve(yaml.ScalarNode, text.strip(), (True, False))
    return tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_number_written_as_a_string(cls, value: object, info: ValidationInfo) -> object:
        # pydantic's lax mode reads "1.0" as 1.0; a spec that quotes a number is a typo to show
        field = cls.model_fields.get(info.field_name or "")
        text = _first_string(value)
        if field is not None and text is not None and _takes_a_number_only(field.annotation):
            if _reads_as_a_number(text):
                written = text.strip()
                raise ValueError(
                    f"a number, not the quoted string {text!r}: write {written} without quotes"
                )
            raise ValueError(f"a number, not the string {text!r}")
        return value


Scalars = float | list[float]


class SpecLoader(yaml.SafeLoader):
    """The YAML loader of specs and configuration files: PyYAML's safe loader, with two
    YAML 1.2 rules.

    A mapping that repeats a key is refused (YAML 1.2 forbids it; PyYAML would keep the last
    value silently). A number in scientific notation without a dot or an exponent sign
    (``1e-6``, ``1e6``, ``1E+3``, ``2.5e3``, ``.5e3``, ``-.5``) is the float YAML 1.2 reads, not
    the string YAML 1.1 reads. Every other resolution (integers, booleans, dates, ``.inf``,
    ``.nan``) is PyYAML's.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


#: YAML 1.2's float with a dot or an exponent (an exponent's sign optional); digits alone stay
#: YAML 1.1's integers (``010`` is 8), and ``.inf``/``.nan`` keep PyYAML's resolver.
_YAML12_FLOAT = re.compile(
    r"^(?=.*[.eE])[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"
)
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))
