"""One reader for every mapping a user writes (catalog entries, recipes, tune search spaces, gateway
options), as xarray's one `_VALIDATORS` table is for its options: a frozen dataclass declares the
fields, a field's metadata (`rule`) what its type cannot say, and the class its error and noun
(`ERROR`, `NOUN`: a recipe says RecipeError and "recipe field")."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Union

from .errors import CatalogError, FieldError

_UNIONS = (Union, types.UnionType)
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def names(value: Any) -> list[str]:
    """A list of names as a user writes it: "a,b" (an option, `--set`) or a YAML list."""
    items = value.split(",") if isinstance(value, str) else (value or ())
    return [str(x).strip() for x in items if str(x).strip()]


def rule(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **meta) -> Any:
    """A field with its checks: `choices`, `lo`/`hi` (`lo_open`/`hi_open`), `what` (the sentence's
    own words for what it takes), `msg` (the whole refusal, `{v}` the value), `unit`, and `key`
    (the YAML key where it differs; "phase.band" reads a nested mapping)."""
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a dataclass (its module uses postponed annotations)."""
    return typing.get_type_hints(cls)


def _range(meta) -> str:
    lo, hi = meta.get("lo"), meta.get("hi")
    if hi is None:
        return "" if lo is None else f" {'>' if meta.get('lo_open') else '>='} {lo:g}"
    return (
        f" in {'(' if meta.get('lo_open') else '['}{-math.inf if lo is None else lo:g},"
        f" {hi:g}{')' if meta.get('hi_open') else ']'}"
    )


def describe(tp: Any, meta: dict) -> str:
    """What a field takes, in words (the second half of its refusal)."""
    if meta.get("what"):
        return meta["what"]
    if "choices" in meta:
        return f"one of {', '.join(map(str, meta['choices']))}"
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in _UNIONS:
        said = " or ".join(describe(a, meta) for a in args)
        return said + (" or null" if len(args) < len(typing.get_args(tp)) else "")
    if tp in _WORDS:
        return _WORDS[tp] + (_range(meta) if tp in (int, float) else "")
    if typing.get_origin(tp) in (tuple, list):
        first, _, rest = (
            describe(args[0], meta).removeprefix("an ").removeprefix("a ").partition(" ")
        )
        return f"a list of {first}{'' if first == 'text' else 's'}{' ' * bool(rest)}{rest}"
    return "a mapping" if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp) else str(tp)


def _in_range(v: float, meta: dict) -> bool:
    lo, hi = meta.get("lo"), meta.get("hi")
    ok = lo is None or (v > lo if meta.get("lo_open") else v >= lo)
    return ok and (hi is None or (v < hi if meta.get("hi_open") else v <= hi))


def _need(ok: bool) -> None:
    if not ok:
        raise FieldError


def _union(v, tp, meta, where, floats):
    args = typing.get_args(tp)
    if v is None and type(None) in args:
        return None
    for a in (a for a in args if a is not type(None)):
        try:
            return convert(v, a, meta, where, floats)
        except FieldError:
            pass
    raise FieldError


def _scalar(v, tp, meta, where, floats):
    if tp in (bool, str):
        _need(isinstance(v, tp))
        return v
    if isinstance(v, str) and tp is float:
        try:
            v = float(v)
        except ValueError:
            raise FieldError from None
    _need(not isinstance(v, bool) and isinstance(v, (int, float) if tp is float else int))
    _need(math.isfinite(v) and _in_range(v, meta))
    return float(v) if floats and tp is float else v


def _sequence(v, tp, meta, where, floats):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    fixed = origin is tuple and (len(args) != 2 or args[1] is not Ellipsis)
    _need(isinstance(v, (list, tuple)) and (not fixed or len(v) == len(args)))
    out = [convert(x, args[i] if fixed else args[0], meta, where, floats) for i, x in enumerate(v)]
    return tuple(out) if origin is tuple else out


def _mapping(v, tp, meta, where, floats):
    _need(isinstance(v, dict))
    k, x = typing.get_args(tp) or (Any, Any)
    return {convert(a, k, {}, where): convert(b, x, {}, where) for a, b in v.items()}


def _nested(v, tp, meta, where, floats):
    if isinstance(v, tp):
        return v
    _need(isinstance(v, dict))
    return from_mapping(tp, v, where)


def _kind(tp: Any):
    """The converter of a field type: union, scalar, sequence, mapping or nested dataclass."""
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        return _union
    if tp in (bool, str, int, float):
        return _scalar
    if origin in (tuple, list):
        return _sequence
    if origin is dict or tp is dict:
        return _mapping
    if dataclasses.is_dataclass(tp):
        return _nested
    raise TypeError(f"mapping.convert: no rule for {tp!r}")


def convert(v: Any, tp: Any, meta: dict, where: str = "", floats: bool = True) -> Any:
    """`v` as a field of type `tp` takes it, or FieldError. `floats=False` keeps ints in float
    fields: a recipe's values enter run ids as written."""
    if tp is Any:
        return v
    if typing.get_origin(tp) not in _UNIONS and "choices" in meta:
        _need(v in tuple(meta["choices"]))
    return _kind(tp)(v, tp, meta, where, floats)


def _at(where: str, text: str) -> str:
    return f"{where}: {text}" if where else text


def check_field(cls: type, f: dataclasses.Field, v: Any, where: str = "", floats: bool = True):
    """`v` converted for field `f` of `cls`, or the one sentence saying what it takes raised."""
    try:
        return convert(v, hints(cls)[f.name], f.metadata, f"{where}: {f.name}", floats)
    except FieldError:
        what = describe(hints(cls)[f.name], f.metadata)
        text = f"{getattr(cls, 'NOUN', 'field')} {f.name} must be {what}, got {v!r}"
        if f.metadata.get("msg"):
            text = f.metadata["msg"].format(v=v)
        raise getattr(cls, "ERROR", CatalogError)(_at(where, text)) from None


def _flatten(data: dict, groups: set[str]) -> dict:
    """Nested mappings whose key is a group of dotted field keys, as `group.key` entries."""
    out = {}
    for k, v in data.items():
        if k in groups and isinstance(v, dict):
            out.update({f"{k}.{sub}": x for sub, x in v.items()})
        else:
            out[k] = v
    return out


def from_mapping(cls: type, data: Any, where: str, floats: bool = True):
    """An instance of dataclass `cls` from a YAML mapping; an unknown, missing or mistyped field is
    one sentence naming `where` and the field (cross-field rules: `cls.__post_init__`)."""
    noun, error = getattr(cls, "NOUN", "field"), getattr(cls, "ERROR", CatalogError)
    if not isinstance(data, dict):
        raise error(_at(where, f"must be a mapping of {noun}s, got {data!r}"))
    fields = {
        f.metadata.get("key", f.name): f
        for f in dataclasses.fields(cls)
        if f.init and not f.metadata.get("internal")
    }
    data = _flatten(data, {k.split(".")[0] for k in fields if "." in k})
    missing = [k for k, f in fields.items() if data.get(k) is None and not has_default(f)]
    if missing:  # first: a renamed field is missing under its new name, unknown under its old one
        raise error(_at(where, f"missing {noun} {missing[0]!r}"))
    unknown = sorted(map(str, set(data) - set(fields)))
    if unknown:
        raise error(
            _at(where, f"unknown {noun}s {unknown}; known: {sorted(fields)}")
            + getattr(cls, "HINT", "")
        )
    kw = {}
    for key, f in fields.items():
        if data.get(key) is not None:
            kw[f.name] = check_field(cls, f, data[key], where, floats)
    try:
        return cls(**kw)
    except FieldError as e:  # a rule across fields (`__post_init__`)
        raise error(_at(where, str(e))) from None


def has_default(f: dataclasses.Field) -> bool:
    """Whether a field may be left out (YAML's null, an empty `key:`, means the default too)."""
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
