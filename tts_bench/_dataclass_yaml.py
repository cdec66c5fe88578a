"""The strict YAML -> frozen dataclass machinery behind `tts_bench.config` (split out for size).

Generic over type hints: int, float, str, bool, Path, `X | None` (any union, tried in order),
`tuple[X, ...]` and fixed `tuple[X, Y]` (nested too), `Literal[...]`, `dict[str, V]` (free-form
when V is Any) and nested dataclasses. Hints are resolved with `typing.get_type_hints`, so
modules may use `from __future__ import annotations`.

    load_dataclass(WerParams, {"beam_size": 3}, source="configs/wer/x.yaml")

Every failure is a ConfigError that names the source (file or `--set`) and the dotted key.
Scalars follow YAML 1.2 core rules: only true/false are booleans (`yes`/`on` stay strings), and
`1e-6` is a float. Files must be UTF-8 (`tts_bench._text`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from stages.flags import EnvFlagError
from tts_bench._text import read_utf8
from tts_bench.errors import ConfigError
from tts_bench.shipped import resolve_config_path, shipped_names

_NONE = type(None)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and reads scalars by YAML 1.2 core rules.

    PyYAML follows YAML 1.1, which differs from 1.2 (and from what users expect) twice:
    - a float needs a dot there (`1.0e-6`); `1e-6` would arrive as the string "1e-6" and fail
      the type check for reasons no user would guess;
    - `yes`/`no`/`on`/`off` are booleans there. The stage flag parser (`stages.flags`) accepts
      only true/false/1/0, so a bare `on` passing as true in YAML while a quoted "on" is refused
      by the flags would be two rules; here only true/false (any case) are booleans, and `on`
      stays the string "on", which a bool field rejects with the accepted values.
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


_BOOL_TAG = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
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
    does not exist from the working directory names a shipped config (`tts_bench.shipped`)."""
    path = resolve_config_path(path)
    if not path.exists():
        raise ConfigError(
            f"error: config file not found ({path}); check the path (shipped configs: "
            f"{', '.join(shipped_names())})"
        )
    text = read_utf8(path, what="config file", option="--config or an include")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"error: invalid YAML ({path}): {exc}; fix the syntax") from None
    return {} if data is None else data


def parse_yaml_value(raw: str, *, where: str) -> Any:
    """Parse an override's right-hand side as YAML (`false` -> False, `'"false"'` -> "false")."""
    try:
        return yaml.load(raw, Loader=_StrictLoader)  # noqa: S506
    except yaml.YAMLError as exc:
        raise ConfigError(f"error: cannot parse value {raw!r} ({where}): {exc}; quote it") from None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


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


def _type_error(tp: Any, value: Any, key: str, source: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(
        f"error: {key or 'config'} must be {type_name(tp)}, got {type(value).__name__} {shown} "
        f"({source}); fix the value"
    )


def _convert_scalar(tp: Any, value: Any, key: str, source: str) -> Any:
    # bool is a subclass of int: reject it first so `true` is never read as 1.
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    else:
        raise ConfigError(f"error: unsupported type hint {tp!r} for {key} ({source}); internal")
    raise _type_error(tp, value, key, source)


def _convert_sequence(tp: Any, value: Any, key: str, source: str, base_dir: Path | None) -> tuple:
    args = typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _type_error(tp, value, key, source)
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(value)
    elif not args:
        item_types = [Any] * len(value)
    else:
        if len(value) != len(args):
            raise _type_error(tp, value, key, source)
        item_types = list(args)
    return tuple(
        convert_value(t, v, key=f"{key}[{i}]", source=source, base_dir=base_dir)
        for i, (t, v) in enumerate(zip(item_types, value))
    )


def _convert_mapping(tp: Any, value: Any, key: str, source: str, base_dir: Path | None) -> dict:
    if not isinstance(value, Mapping):
        raise _type_error(tp, value, key, source)
    args = typing.get_args(tp)
    value_type = args[1] if len(args) == 2 else Any
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise ConfigError(f"error: key {k!r} under {key} must be a string ({source}); quote it")
        out[k] = convert_value(value_type, v, key=f"{key}.{k}", source=source, base_dir=base_dir)
    return out


def _include(cls: type, rel: str, key: str, source: str, base_dir: Path | None) -> Any:
    path = resolve_config_path(rel, base_dir or Path.cwd())
    if not path.is_file():
        raise ConfigError(
            f"error: {key} includes {rel!r}, which is not a file ({source}); "
            f"include paths are relative to the including file (or configs/... for a shipped one)"
        )
    # Keys inside the included file keep their full dotted name (stages.talker.x). No cycle
    # guard needed: an include always loads a strictly smaller section type.
    data = load_yaml_file(path)
    return load_dataclass(cls, data, source=str(path), base_dir=path.parent, prefix=key)


def convert_value(
    tp: Any, value: Any, *, key: str, source: str, base_dir: Path | None = None
) -> Any:
    """Check and convert one YAML value against a type hint; `key` is the dotted name for errors."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if _is_union(tp):
        args = typing.get_args(tp)
        if value is None and _NONE in args:
            return None
        options = [a for a in args if a is not _NONE]
        if len(options) == 1 and typing.get_origin(options[0]) not in (None, Literal):
            # One structured alternative: let its own error (unknown key, bad item) through.
            return convert_value(options[0], value, key=key, source=source, base_dir=base_dir)
        for arg in options:
            try:
                return convert_value(arg, value, key=key, source=source, base_dir=base_dir)
            except ConfigError:
                continue
        raise _type_error(tp, value, key, source)
    if origin is Literal:
        # Same type and value, so Literal[1] does not accept True.
        if any(type(value) is type(a) and value == a for a in typing.get_args(tp)):
            return value
        raise _type_error(tp, value, key, source)
    if origin is tuple or tp is tuple:
        return _convert_sequence(tp, value, key, source, base_dir)
    if origin is dict or tp is dict:
        return _convert_mapping(tp, value, key, source, base_dir)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str):
            return _include(tp, value, key, source, base_dir)
        if isinstance(value, Mapping):
            return load_dataclass(tp, value, source=source, base_dir=base_dir, prefix=key)
        raise _type_error(tp, value, key, source)
    return _convert_scalar(tp, value, key, source)


def _unknown_key(name: str, valid: list[str], prefix: str, source: str) -> ConfigError:
    dotted = f"{prefix}.{name}" if prefix else str(name)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = (
        f"did you mean {(prefix + '.' if prefix else '') + close[0]!r}?"
        if close
        else f"valid keys here: {', '.join(valid)}"
    )
    return ConfigError(f"error: unknown key {dotted!r} ({source}); {hint}")


# What a dataclass's __post_init__ may raise about a value: ValueError as its contract, and
# ArithmeticError when a check divides by a value that is 0 before testing it (e.g. dims).
_VALUE_ERRORS = (ValueError, ArithmeticError)


def _construct(cls: type, kwargs: dict[str, Any], *, source: str, prefix: str) -> Any:
    try:
        return cls(**kwargs)
    except _VALUE_ERRORS as exc:
        raise _invalid(exc, prefix, source) from None


def _invalid(exc: Exception, prefix: str, source: str) -> ConfigError:
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


def load_dataclass(
    cls: type,
    mapping: Any,
    *,
    source: str,
    base_dir: Path | None = None,
    prefix: str = "",
) -> Any:
    """Build dataclass `cls` from a YAML mapping, strictly; missing keys keep their defaults."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(
            f"error: {prefix or 'the config'} must be a mapping, got {type(mapping).__name__} "
            f"({source}); write key: value lines"
        )
    hints = _hints(cls)
    kwargs = {}
    for name, value in mapping.items():
        if name not in hints:
            raise _unknown_key(name, list(hints), prefix, source)
        dotted = f"{prefix}.{name}" if prefix else name
        kwargs[name] = convert_value(
            hints[name], value, key=dotted, source=source, base_dir=base_dir
        )
    return _construct(cls, kwargs, source=source, prefix=prefix)


def _set_in_dict(d: dict, parts: list[str], value: Any) -> dict:
    out = dict(d)
    if len(parts) == 1:
        out[parts[0]] = value
        return out
    inner = out.get(parts[0])
    out[parts[0]] = _set_in_dict(inner if isinstance(inner, dict) else {}, parts[1:], value)
    return out


def set_path(
    obj: Any, parts: list[str], value: Any, *, source: str, base_dir: Path | None, done: str = ""
) -> Any:
    """Return a copy of dataclass `obj` with dotted path `parts` set to `value` (typed)."""
    name, rest = parts[0], parts[1:]
    hints = _hints(type(obj))
    if name not in hints:
        raise _unknown_key(name, list(hints), done, source)
    dotted = f"{done}.{name}" if done else name
    tp, current = hints[name], getattr(obj, name)
    if not rest:
        new = convert_value(tp, value, key=dotted, source=source, base_dir=base_dir)
    elif dataclasses.is_dataclass(current):
        new = set_path(current, rest, value, source=source, base_dir=base_dir, done=dotted)
    elif isinstance(current, dict) or typing.get_origin(tp) is dict:
        # Free-form mapping (stage `extra`): any key, the value kept as parsed.
        full = _set_in_dict(current or {}, rest, value)
        new = convert_value(tp, full, key=dotted, source=source, base_dir=base_dir)
    else:
        raise ConfigError(
            f"error: {dotted} is {type_name(tp)}, it has no key {rest[0]!r} ({source}); "
            f"set {dotted}=<value> instead"
        )
    try:
        return dataclasses.replace(obj, **{name: new})
    except _VALUE_ERRORS as exc:
        raise _invalid(exc, done, source) from None
