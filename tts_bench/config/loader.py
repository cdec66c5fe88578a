"""The strict YAML -> frozen dataclass loader behind `tts_bench.config` (split out for size).

The schema stays plain frozen dataclasses (`stages/` must not import pydantic; `replace()`,
`fields()` and `asdict()` keep working everywhere); pydantic checks a document against them with
a `TypeAdapter` in strict JSON mode, which is exactly a config file's contract: lists become
tuples, an int is a float, a bool is never an int, a string is never a number, unknown keys are
refused (`extra="forbid"`), and each section's `__post_init__` then validates across keys. What
stays ours is what users read: pydantic's errors are translated into one ConfigError naming the
source (file, included file or `--set`), the dotted key, the expected type in words and, for an
unknown key, the nearest valid name (`difflib`).

    load_dataclass(WerParams, {"beam_size": 3}, source="configs/wer/x.yaml")

Also ours: the YAML reading (YAML 1.2 core scalars: only true/false are booleans, `1e-6` is a
float, no timestamps; duplicate keys refused; UTF-8 files, `tts_bench.inputs.text`) and includes (a
string where a section is expected is a file, relative to the including one: `stages:
../stages/tiny.yaml`, or a shipped `configs/...`). Overrides (`set_path`) edit the config's data
and validate the whole tree again, so cross-key checks of every enclosing section run, as in a
file.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import pydantic
import yaml

from stages.flags import EnvFlagError
from tts_bench.inputs.text import read_utf8
from tts_bench.config.yaml_aliases import AliasBlowUp, check_expansion
from tts_bench.errors import ConfigError
from tts_bench.config.shipped import resolve_config_path, shipped_names

_NONE = type(None)
Loc = tuple[Any, ...]  # a pydantic error location: field names, list indices, union tags


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads scalars by YAML 1.2 core rules.

    PyYAML follows YAML 1.1, which differs from 1.2 (and from what users expect) three times:
    - a float needs a dot there (`1.0e-6`); `1e-6` would arrive as the string "1e-6" and fail
      the type check for reasons no user would guess;
    - `yes`/`no`/`on`/`off` are booleans there. The stage flag parser (`stages.flags`) accepts
      only true/false/1/0, so a bare `on` passing as true in YAML while a quoted "on" is refused
      by the flags would be two rules; here only true/false (any case) are booleans, and `on`
      stays the string "on", which a bool field rejects with the accepted values;
    - `2026-12-01` is a date there; in 1.2 it is the string it looks like.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # the base constructor reports unhashable keys itself
            if key != "<<" and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def get_single_data(self) -> Any:
        # Measured before it is built: an alias bomb never reaches `_plain` (tts_bench.config.yaml_aliases).
        node = self.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return self.construct_document(node)


_BOOL_TAG, _TIMESTAMP_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml_file(path: Path) -> Any:
    """Read one YAML document; a missing, unreadable or non-UTF-8 file or bad YAML is a
    ConfigError naming the file (and the line where there is one). A `configs/...` path that
    does not exist from the working directory names a shipped config (`tts_bench.config.shipped`)."""
    path = resolve_config_path(path)
    if not path.exists():
        raise ConfigError(
            f"error: config file not found ({path}); check the path (shipped configs: "
            f"{', '.join(shipped_names())})"
        )
    text = read_utf8(path, what="config file", option="--config or an include")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except AliasBlowUp as exc:
        raise ConfigError(exc.message(str(path))) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"error: invalid YAML ({path}): {_yaml_problem(exc)}; fix the syntax") from None
    return {} if data is None else data


def parse_yaml_value(raw: str, *, where: str) -> Any:
    """Parse an override's right-hand side as YAML (`false` -> False, `'"false"'` -> "false")."""
    try:
        return yaml.load(raw, Loader=_StrictLoader)  # noqa: S506
    except AliasBlowUp as exc:
        raise ConfigError(exc.message(where)) from None
    except (yaml.YAMLError, RecursionError) as exc:
        shown = raw if len(raw) <= 60 else raw[:57] + "..."
        raise ConfigError(f"error: cannot parse value {shown!r} ({where}): {_yaml_problem(exc)}; quote it") from None


def _yaml_problem(exc: Exception) -> str:
    # PyYAML composes nodes recursively: a few thousand `[` end in RecursionError, not YAMLError.
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


# ---------------------------------------------------------------- type hints, in words


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.lru_cache(maxsize=None)
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _options(tp: Any) -> list[Any]:
    """The non-null alternatives of a union (the type itself otherwise)."""
    return [a for a in typing.get_args(tp) if a is not _NONE] if _is_union(tp) else [tp]


def _section(tp: Any) -> type | None:
    """The dataclass a hint holds (`X` or `X | None`), else None."""
    options = _options(tp)
    if len(options) == 1 and dataclasses.is_dataclass(options[0]):
        return options[0]
    return None


def type_name(tp: Any) -> str:
    """Human wording of a type hint for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any value"
    if _is_union(tp):
        return " or ".join("null" if a is _NONE else type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_name(args[0])}"
        return f"list of {len(args)} [{', '.join(type_name(a) for a in args)}]"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return f"mapping ({tp.__name__}) or include path"
    if tp is float:
        return "float (number)"
    if tp is bool:
        return "bool (true or false)"
    return getattr(tp, "__name__", str(tp))


def _dotted(prefix: str, part: Any) -> str:
    if isinstance(part, int):
        return f"{prefix}[{part}]"
    return f"{prefix}.{part}" if prefix else str(part)


# ---------------------------------------------------------------- plain data, includes


MAX_DEPTH = 64  # nesting of lists and mappings; configs need a handful, JSON parsers stop at ~200


def _plain(value: Any, key: str, source: str, _path: tuple[int, ...] = ()) -> Any:
    """YAML data as JSON data (what the strict validation reads); anything else is refused."""
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in _path:  # YAML anchors can make a value contain itself: `&a [*a]`
            raise ConfigError(f"error: {key or 'the config'} contains itself (a YAML alias cycle) "
                              f"({source}); write the value out")
        if len(_path) >= MAX_DEPTH:
            raise ConfigError(f"error: {key.split('[')[0]} nests lists or mappings more than {MAX_DEPTH} deep "
                              f"({source}); flatten the value")
        _path = (*_path, id(value))
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"error: key {k!r} under {key or 'the config'} must be a string "
                                  f"({source}); quote it")
            out[k] = _plain(v, _dotted(key, k), source, _path)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, _dotted(key, i), source, _path) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        # YAML's .inf / .nan (or 1e400) are floats the range checks (`> 0`) let through: an
        # infinite delay or timeout waits forever, a NaN threshold never trips. No setting
        # means "unbounded" by infinity (that is null where it exists).
        raise ConfigError(f"error: {key or 'config'} must be a finite number, got {value} ({source}); "
                          "write a finite value")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ConfigError(f"error: {key or 'config'} holds a {type(value).__name__}, not plain YAML data "
                      f"({source}); write a string, number, true/false, list or mapping")


def _inline_includes(cls: type, data: dict, *, source: str, base_dir: Path | None, loc: Loc,
                     sources: dict[Loc, str]) -> dict:
    """`data` with every include (a string where a section is expected) replaced by the file's
    mapping, recursively; `sources` learns which file each included section came from."""
    hints, out = _hints(cls), dict(data)
    for name, value in data.items():
        section = _section(hints[name]) if name in hints else None
        if section is None:
            continue
        here, sub_source, sub_dir = (*loc, name), source, base_dir
        if isinstance(value, str):
            path = _include_path(value, _dotted(".".join(map(str, loc)), name), source, base_dir)
            value = _plain(load_yaml_file(path), ".".join(map(str, here)), str(path))
            sources[here] = sub_source = str(path)
            sub_dir = path.parent
            if not isinstance(value, dict):
                raise ConfigError(f"error: {'.'.join(map(str, here))} must be a mapping, got "
                                  f"{type(value).__name__} ({path}); write key: value lines")
        if isinstance(value, dict):
            out[name] = _inline_includes(section, value, source=sub_source, base_dir=sub_dir,
                                         loc=here, sources=sources)
    return out


def _include_path(rel: str, key: str, source: str, base_dir: Path | None) -> Path:
    # No cycle guard needed: an include always holds a strictly smaller section type.
    path = resolve_config_path(rel, base_dir or Path.cwd())
    if not path.is_file():
        raise ConfigError(
            f"error: {key} includes {rel!r}, which is not a file ({source}); "
            f"include paths are relative to the including file (or configs/... for a shipped one)"
        )
    return path


# ---------------------------------------------------------------- pydantic's errors, in our words


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where an error location points: the dotted key, the hint there and the value given."""

    key: str
    hint: Any
    value: Any


def _place(cls: type, data: Any, loc: Loc) -> _Place:
    """Follow `loc` through the hints and the data as far as our words go: a union with several
    alternatives is reported as a whole (its loc continues with pydantic's member tags)."""
    hint, value, key = cls, data, ""
    for part in loc:
        section = _section(hint)
        if section is not None and isinstance(part, str):
            hint = _hints(section).get(part, Any)
        elif len(_options(hint)) > 1 or hint is Any:
            break
        else:
            hint = _options(hint)[0]
            origin, args = typing.get_origin(hint), typing.get_args(hint)
            if origin is tuple and isinstance(part, int):
                hint = args[0] if len(args) == 2 and args[1] is Ellipsis else args[part]
            elif origin is dict:
                hint = args[1] if len(args) == 2 else Any
            else:
                break
        value = value[part] if isinstance(value, (dict, list)) and _has(value, part) else None
        key = _dotted(key, part)
    return _Place(key, hint, value)


def _has(container: dict | list, part: Any) -> bool:
    return part in container if isinstance(container, dict) else isinstance(part, int) and part < len(container)


def _source_of(loc: Loc, sources: dict[Loc, str], default: str) -> str:
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]]
    return default


def _unknown_key(name: Any, valid: list[str], prefix: str, source: str) -> ConfigError:
    dotted = _dotted(prefix, str(name))
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f"did you mean {_dotted(prefix, close[0])!r}?" if close else f"valid keys here: {', '.join(valid)}"
    return ConfigError(f"error: unknown key {dotted!r} ({source}); {hint}")


def _type_error(place: _Place, source: str) -> ConfigError:
    shown = repr(place.value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(
        f"error: {place.key or 'config'} must be {type_name(place.hint)}, got "
        f"{type(place.value).__name__} {shown} ({source}); fix the value"
    )


def _invalid(exc: BaseException, prefix: str, source: str) -> ConfigError:
    """A dataclass __post_init__ rejected a value: keep its words, add where it came from.

    An environment variable's error (stages.flags.EnvFlagError) is not the file's fault: it
    keeps its own words and `(environment)`."""
    if isinstance(exc, EnvFlagError):
        return ConfigError(str(exc))
    msg = str(exc).removeprefix("error: ")  # stages.flags errors are already user-facing
    if isinstance(exc, ArithmeticError):
        msg = f"a value makes this section invalid ({type(exc).__name__}: {msg})"
    where = f"{prefix}: " if prefix and prefix.split(".")[-1] not in msg else ""
    return ConfigError(f"error: {where}{msg} ({source}); fix the value")


def _translate(err: Any, cls: type, data: Any, sources: dict[Loc, str], source: str) -> ConfigError:
    """The first pydantic error as a ConfigError (never pydantic's own text)."""
    loc, kind = tuple(err["loc"]), err["type"]
    where = _source_of(loc, sources, source)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        owner = _place(cls, data, loc[:-1])
        valid = list(_hints(_section(owner.hint))) if _section(owner.hint) else []
        return _unknown_key(loc[-1], valid, owner.key, where)
    if kind == "json_invalid":  # not expected: _plain hands over JSON well within its limits
        return ConfigError(f"error: the config cannot be checked ({err['msg']}) ({where}); simplify it")
    place = _place(cls, data, loc)
    if kind in ("value_error", "assertion_error"):  # a __post_init__ refused the section
        return _invalid(err["ctx"]["error"], place.key, where)
    if kind in ("missing", "missing_argument"):
        return ConfigError(f"error: {place.key} is required ({where}); add it")
    return _type_error(place, where)


# ---------------------------------------------------------------- the loader


def load_dataclass(cls: type, mapping: Any, *, source: str, base_dir: Path | None = None) -> Any:
    """Build dataclass `cls` from a YAML mapping, strictly; missing keys keep their defaults.
    Includes are read relative to `base_dir` (default: the working directory)."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f"error: the config must be a mapping, got {type(mapping).__name__} ({source}); "
            f"write key: value lines"
        )
    sources: dict[Loc, str] = {}
    data = _plain(mapping, "", source)
    data = _inline_includes(cls, data, source=source, base_dir=base_dir, loc=(), sources=sources)
    try:
        return _adapter(cls).validate_json(json.dumps(data, allow_nan=True), strict=True, extra="forbid")
    except pydantic.ValidationError as exc:
        raise _translate(exc.errors()[0], cls, data, sources, source) from None
    except (ValueError, ArithmeticError) as exc:
        # Raised outside pydantic's reach: by the __post_init__ of a section built by its
        # default_factory (an environment flag, stages.flags.EnvFlagError), or a __post_init__
        # that divided by a value before checking it (pydantic converts only ValueError).
        raise _invalid(exc, "", source) from None


def to_data(obj: Any) -> Any:
    """A dataclass tree as JSON-safe data (tuples as lists, paths as strings); it loads back
    through load_dataclass to an equal tree."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _set_in(cls: type, data: dict, parts: list[str], value: Any, *, done: str, source: str) -> dict:
    """A copy of dataclass data `data` with dotted path `parts` set; the path is checked here
    (unknown keys, keys under a scalar), the value by the validation that follows."""
    name, rest = parts[0], parts[1:]
    hints = _hints(cls)
    if name not in hints:
        raise _unknown_key(name, list(hints), done, source)
    dotted, out = _dotted(done, name), dict(data)
    if not rest:
        out[name] = value
        return out
    current, section = data.get(name), _section(hints[name])
    if section is not None:
        out[name] = _set_in(section, current if isinstance(current, dict) else {}, rest, value,
                            done=dotted, source=source)
    elif typing.get_origin(_options(hints[name])[0]) is dict:
        # Free-form mapping (stage `extra`): any key, the value kept as parsed.
        out[name] = _set_in_dict(current if isinstance(current, dict) else {}, rest, value)
    else:
        raise ConfigError(
            f"error: {dotted} is {type_name(hints[name])}, it has no key {rest[0]!r} ({source}); "
            f"set {dotted}=<value> instead"
        )
    return out


def _set_in_dict(d: dict, parts: list[str], value: Any) -> dict:
    out = dict(d)
    if len(parts) == 1:
        out[parts[0]] = value
        return out
    inner = out.get(parts[0])
    out[parts[0]] = _set_in_dict(inner if isinstance(inner, dict) else {}, parts[1:], value)
    return out


def set_path(obj: Any, parts: list[str], value: Any, *, source: str, base_dir: Path | None) -> Any:
    """A copy of dataclass `obj` with dotted path `parts` set to `value`, validated like a file
    (a string at a section is an include relative to `base_dir`)."""
    data = _set_in(type(obj), to_data(obj), parts, value, done="", source=source)
    return load_dataclass(type(obj), data, source=source, base_dir=base_dir)
