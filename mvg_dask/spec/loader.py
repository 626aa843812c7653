"""Reading and validating a spec: YAML to a :class:`ReleaseSpec`, paths resolved against the
spec's directory, and every pydantic error as one line naming its field (an unknown word with
its closest choice)."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from mvg_dask.spec.base import SpecError, SpecLoader, _Strict
from mvg_dask.spec.release import ReleaseSpec
from mvg_dask.spec.sections import OutputSpec


def _section_names() -> frozenset[str]:
    """The class names of every spec section."""
    names: set[str] = set()
    todo: list[type] = [_Strict]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def _union_member(part: str) -> bool:
    """Whether a location part is the tag pydantic gives a union member's errors: a spec
    section's class name (``ColumnsSpec``) or a type (``list[...]``, ``literal[...]``)."""
    return "[" in part or part in _section_names()


#: An error: its location (dotted path parts), message and pydantic error type.
_Error = tuple[tuple[str, ...], str, str]


def _furthest_member(errors: list[_Error]) -> list[_Error]:
    """Of a union's errors, only those of the member that matched furthest (an error deeper
    than every other member's), without its tag: ``query.cross-covariance.cols.box: ...``, not
    one error per member of ``query`` and of ``cols``. A word given where a union takes a
    word or a mapping (``query: covarience``) keeps the word's error alone. Where no member
    matched further than the others (a ``query`` of an unknown form), every member's errors
    stay, with their tags."""
    kept: list[_Error] = []
    unions: dict[tuple[str, ...], list[tuple[str, tuple[str, ...], str, str]]] = {}
    for loc, msg, kind in errors:
        at = next((i for i, part in enumerate(loc) if _union_member(part)), None)
        if at is None:
            kept.append((loc, msg, kind))
        else:
            unions.setdefault(loc[:at], []).append((loc[at], loc[at + 1 :], msg, kind))
    for field, members in unions.items():
        depth: dict[str, int] = {}
        for tag, rest, _, _ in members:
            depth[tag] = max(depth.get(tag, 0), len(rest))
        deepest = max(depth.values())
        best = [tag for tag, d in depth.items() if d == deepest]
        if deepest == 0 and any(kind == "literal_error" for *_, kind in members):
            if all(kind in ("literal_error", "model_type") for *_, kind in members):
                kept.extend((field, msg, kind) for *_, msg, kind in members if kind != "model_type")
                continue
        if deepest == 0 or len(best) > 1:
            kept.extend(((*field, tag, *rest), msg, kind) for tag, rest, msg, kind in members)
            continue
        inner = [(rest, msg, kind) for tag, rest, msg, kind in members if tag == best[0]]
        kept.extend((field + loc, msg, kind) for loc, msg, kind in _furthest_member(inner))
    return kept


def _annotations(annotation: object) -> list[object]:
    """``annotation`` and every type inside it (union members, ``Annotated`` and list items)."""
    found = [annotation]
    if typing.get_origin(annotation) is not Literal:
        for arg in typing.get_args(annotation):
            found.extend(_annotations(arg))
    return found


def _choices(root: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The words an enumerated (``Literal``) field at ``loc`` of ``root`` takes, in the order
    the code declares them (empty when ``loc`` is not such a field)."""
    annotations: list[object] = [root]
    for part in loc:
        if _union_member(part):
            continue
        inside: list[object] = []
        for a in annotations:
            for model in _annotations(a):
                if isinstance(model, type) and issubclass(model, BaseModel):
                    inside.extend(
                        f.annotation
                        for name, f in model.model_fields.items()
                        if part in (name, f.alias)
                    )
        if not inside and part.isdigit():
            continue  # an item of a list
        annotations = inside
    return [
        str(word)
        for a in annotations
        for t in _annotations(a)
        if typing.get_origin(t) is Literal
        for word in typing.get_args(t)
    ]


#: How an enumerated field's error names its values: ``field: (a value, the values)``.
_NOUNS = {
    "query": ("query", "queries"),
    "strategy": ("strategy", "strategies"),
    "neighbours": ("neighbour relation", "neighbour relations"),
    "on_violation": ("value", "values"),
    "noise": ("noise kind", "noise kinds"),
}


def _unknown_word(loc: tuple[str, ...], value: object, choices: list[str]) -> str:
    """``unknown query 'covarience'; did you mean 'covariance'? The queries are: ...``."""
    name = next((p for p in reversed(loc) if not _union_member(p) and not p.isdigit()), "value")
    one, many = _NOUNS.get(name, (name, f"{name}s"))
    close = difflib.get_close_matches(str(value), choices, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else "."
    return f"unknown {one} {value!r}{guess} The {many} are: {', '.join(choices)}"


def _format_error(exc: ValidationError, root: type[BaseModel]) -> str:
    errors: list[_Error] = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"] if not str(p).startswith(("function-", "tag:")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling)"
        if err["type"] == "literal_error":
            choices = _choices(root, loc)
            if choices:
                msg = _unknown_word(loc, err["input"], choices)
        errors.append((loc, msg, err["type"]))
    kept = _furthest_member(errors)
    parts = [f"{'.'.join(loc)}: {msg}" if loc else msg for loc, msg, _ in kept]
    return "; ".join(parts)


def parse_spec(data: object, *, source: str = "spec") -> ReleaseSpec:
    """Validate a spec given as a mapping.

    Parameters
    ----------
    data : object
        The parsed YAML.
    source : str
        Name used in error messages.

    Returns
    -------
    ReleaseSpec
        The validated spec.

    Raises
    ------
    SpecError
        Naming every invalid field.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a release spec must be a mapping of keys to values")
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_format_error(exc, ReleaseSpec)}") from None


def with_output_store(spec: ReleaseSpec, store: str) -> ReleaseSpec:
    """``spec`` with ``output.store`` replaced by ``store``, validated as a spec's own is.

    Parameters
    ----------
    spec : ReleaseSpec
        A validated spec.
    store : str
        The new output store (an absolute path or an fsspec URL).

    Returns
    -------
    ReleaseSpec
        The spec writing to ``store``.

    Raises
    ------
    SpecError
        When ``store`` is not a valid output store (``OutputSpec``'s checks).
    """
    try:
        output = OutputSpec.model_validate(
            {**spec.output.model_dump(exclude_unset=True), "store": store}
        )
    except ValidationError as exc:
        raise SpecError(f"output.{_format_error(exc, OutputSpec)}") from None
    return spec.model_copy(update={"output": output})


def parse_yaml(text: str, source: str) -> object:
    """Parse a YAML spec: duplicate keys refused, errors with their line and column.

    Parameters
    ----------
    text : str
        The YAML.
    source : str
        The file's name, for messages.

    Returns
    -------
    object
        The parsed document.

    Raises
    ------
    SpecError
        ``source:line:column: ...`` for invalid YAML or a repeated key.
    """
    try:
        return yaml.load(text, Loader=SpecLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        what = exc.problem or exc.context or "not valid YAML"
        raise SpecError(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None


def load_spec(path: str | Path) -> ReleaseSpec:
    """Read and validate a YAML release spec.

    Relative store paths are resolved against the spec file's directory.

    Parameters
    ----------
    path : str or Path
        The YAML file.

    Returns
    -------
    ReleaseSpec
        The validated spec.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read spec {p}: {exc.strerror}") from None
    data = parse_yaml(text, str(p))
    spec = parse_spec(data, source=str(p))
    return resolve_paths(spec, p.parent)


def _resolve(store: str, base: Path) -> str:
    if "://" in store or Path(store).is_absolute():
        return store
    return str((base / store).resolve())


def _resolve_sqlite_url(url: str, base: Path) -> str:
    """``sqlite:///relative`` against ``base`` (``sqlite:////absolute`` and other URLs as is)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not Path(url[len(prefix) :]).is_absolute():
        return prefix + _resolve(url[len(prefix) :], base)
    return url


def resolve_paths(spec: ReleaseSpec, base: Path) -> ReleaseSpec:
    """Resolve relative store and matrix paths against ``base``."""
    directions = spec.mechanism.directions
    if directions.path is not None:
        directions = directions.model_copy(update={"path": _resolve(directions.path, base)})
    ledger = spec.ledger
    if ledger is not None:
        ledger = ledger.model_copy(
            update={
                "path": None if ledger.path is None else _resolve(ledger.path, base),
                "url": None if ledger.url is None else _resolve_sqlite_url(ledger.url, base),
                "password_file": (
                    None if ledger.password_file is None else _resolve(ledger.password_file, base)
                ),
            }
        )
    return spec.model_copy(
        update={
            "ledger": ledger,
            "input": spec.input.model_copy(update={"store": _resolve(spec.input.store, base)}),
            "output": spec.output.model_copy(update={"store": _resolve(spec.output.store, base)}),
            "mechanism": spec.mechanism.model_copy(update={"directions": directions}),
        }
    )
