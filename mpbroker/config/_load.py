"""Loading: TOML in, a validated `Config` out, with a `ConfigError` that names the key, the
value and what is allowed for anything refused (an unknown key, a value of the wrong type
or out of range, contradicting limits)."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._schema import (
    ACL_PERMISSIONS,
    DESTINATION_KEYS,
    AclEntry,
    Config,
    DestinationSettings,
    QuotaConfig,
    section_defaults,
    sections,
)
from ._units import parse_size
from ._validate import check_consistency, check_security, check_watermark

__all__ = ["config_from_mapping", "iter_settings", "load_config", "replace_settings"]


def _describe(meta: Mapping[str, Any], kind: type) -> str:
    choices = meta.get("choices")
    if choices:
        return "allowed: " + ", ".join(repr(c) for c in choices)
    lo, hi = meta.get("min"), meta.get("max")
    what = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[kind]
    if lo is not None and hi is not None:
        return f"must be {what} from {lo:g} to {hi:g}"
    if lo is not None:
        return f"must be {what} >= {lo:g}"
    if hi is not None:
        return f"must be {what} <= {hi:g}"
    return f"must be {what}"


def _coerce(key: str, value: object, f: dataclasses.Field[Any]) -> Any:
    kind: type = {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]
    meta = f.metadata
    allowed = _describe(meta, kind)
    if kind is int and (key.endswith("_bytes") or meta.get("size")) and isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError:
            raise ConfigError(key, value, allowed + " (or a size such as '16MiB')") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if meta.get("share") and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # bytes, as the text would say them
    if kind is str and isinstance(value, bool) and {"true", "false"} <= set(meta["choices"] or ()):
        value = "true" if value else "false"  # `allow_anonymous = true`, as TOML writes it
    # bool is a subclass of int in Python; `gateways = true` is a mistake, not 1.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(key, value, allowed)
    if kind is float and not math.isfinite(value):  # type: ignore[arg-type]
        raise ConfigError(key, value, allowed)
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(key, value, allowed)
    lo, hi = meta.get("min"), meta.get("max")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(key, value, allowed)
    return value


def config_from_mapping(data: Mapping[str, Any]) -> Config:
    """Build and validate a Config from a nested mapping (a parsed TOML document)."""
    sections = section_defaults()
    built: dict[str, Any] = {}
    for name, value in data.items():
        if name == "destinations":
            built[name] = _destination_tables(value)
            continue
        if name == "quotas":
            built[name] = _quota_tables(value)
            continue
        if name not in sections:
            raise ConfigError(name, value, "unknown section; known: " + ", ".join(sections))
        if not isinstance(value, Mapping):
            raise ConfigError(name, value, "must be a table of settings")
        if name == "security" and "acl" in value:
            built["acl"] = _acl_entries(value["acl"])
            value = {k: v for k, v in value.items() if k != "acl"}
        default = sections[name]
        fields = {f.name: f for f in dataclasses.fields(default)}
        kwargs: dict[str, Any] = {}
        for key, raw in value.items():
            full = f"{name}.{key}"
            if key not in fields:
                raise ConfigError(full, raw, "unknown setting; known: " + ", ".join(fields))
            kwargs[key] = _coerce(full, raw, fields[key])
        built[name] = dataclasses.replace(default, **kwargs)
    config = Config(**built)
    check_consistency(config)
    check_security(config)
    return config


def _destination_tables(data: object) -> tuple[DestinationSettings, ...]:
    if not isinstance(data, Mapping):
        raise ConfigError("destinations", data, 'must be tables: [destinations."/queue/NAME*"]')
    defaults = section_defaults()
    tables: list[DestinationSettings] = []
    for pattern, table in data.items():
        where = f'destinations."{pattern}"'
        if not pattern.startswith(("/queue/", "/topic/")):
            raise ConfigError(where, pattern, "a pattern starts with /queue/ or /topic/")
        if not isinstance(table, Mapping):
            raise ConfigError(where, table, "must be a table of settings")
        values: dict[str, Any] = {}
        for key, raw in table.items():
            section = DESTINATION_KEYS.get(key)
            if section is None:
                raise ConfigError(
                    f"{where}.{key}", raw, "unknown setting; known: " + ", ".join(DESTINATION_KEYS)
                )
            if section == "quotas":
                if not isinstance(raw, str) or not raw:
                    raise ConfigError(f"{where}.{key}", raw, "must name a [quotas.NAME] table")
                values[key] = raw
                continue
            fields = {f.name: f for f in dataclasses.fields(defaults[section])}
            values[key] = _coerce(f"{where}.{key}", raw, fields[key])
        # Watermarks come in pairs: a high with the store's default low could contradict.
        for high_key in ("msg_high", "byte_high", "live_msg_high"):
            low_key = high_key.replace("_high", "_low")
            if (high_key in values) != (low_key in values):
                missing = low_key if high_key in values else high_key
                raise ConfigError(
                    f"{where}.{missing}", None, f"must be set together with {high_key}/{low_key}"
                )
            if high_key in values:
                check_watermark(
                    f"{where}.{high_key}", values[high_key], f"{where}.{low_key}", values[low_key]
                )
        tables.append(DestinationSettings(pattern, **values))
    return tuple(tables)


def _quota_tables(data: object) -> tuple[QuotaConfig, ...]:
    if not isinstance(data, Mapping):
        raise ConfigError("quotas", data, "must be tables: [quotas.NAME]")
    fields = {f.name: f for f in dataclasses.fields(QuotaConfig) if f.name != "name"}
    quotas = []
    for name, table in data.items():
        where = f"quotas.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(where, table, "must be a table of settings")
        values: dict[str, Any] = {}
        for key, raw in table.items():
            if key not in fields:
                raise ConfigError(
                    f"{where}.{key}", raw, "unknown setting; known: " + ", ".join(fields)
                )
            values[key] = _coerce(f"{where}.{key}", raw, fields[key])
        quotas.append(QuotaConfig(name, **values))
    return tuple(quotas)


# A user or group name (as the users file allows them: mpbroker.security.check_name).
_PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9._@-]{1,128}")


def _acl_entries(data: object) -> tuple[AclEntry, ...]:
    if not isinstance(data, list):
        raise ConfigError("security.acl", data, "must be entries: [[security.acl]]")
    entries = []
    for number, table in enumerate(data, start=1):
        where = f"security.acl[{number}]"
        if not isinstance(table, Mapping):
            raise ConfigError(where, table, "must be a table: [[security.acl]]")
        unknown = [k for k in table if k not in ("destination", *ACL_PERMISSIONS)]
        if unknown:
            known = ", ".join(("destination", *ACL_PERMISSIONS))
            raise ConfigError(
                f"{where}.{unknown[0]}", table[unknown[0]], f"unknown; known: {known}"
            )
        pattern = table.get("destination")
        if not isinstance(pattern, str) or not pattern.startswith(("/queue/", "/topic/")):
            raise ConfigError(
                f"{where}.destination", pattern, "a pattern that starts with /queue/ or /topic/"
            )
        granted: dict[str, tuple[str, ...]] = {}
        for permission in ACL_PERMISSIONS:
            names = table.get(permission, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ConfigError(f"{where}.{permission}", names, "must be a list of names")
            for name in names:
                bare = name.removeprefix("group:")
                if name != "*" and not _PRINCIPAL_NAME.fullmatch(bare):
                    raise ConfigError(
                        f"{where}.{permission}",
                        name,
                        "a user name, group:NAME or * (names: letters, digits and . _ @ -)",
                    )
            granted[permission] = tuple(names)
        entries.append(AclEntry(pattern, **granted))
    return tuple(entries)


def load_config(path: str | Path | None = None) -> Config:
    """The embedded defaults, overlaid with a TOML file when one is given."""
    if path is None:
        return config_from_mapping({})
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("--config", str(path), "file not found") from None
    except OSError as exc:
        raise ConfigError("--config", str(path), f"cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", str(path), f"not UTF-8 text: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", str(path), f"not valid TOML: {exc}") from None
    return config_from_mapping(data)


def iter_settings(config: Config) -> list[tuple[str, Any, str]]:
    """(key, value, doc) for every setting, in declaration order (for `config show`)."""
    rows: list[tuple[str, Any, str]] = []
    for section in sections():
        obj = getattr(config, section.name)
        for f in dataclasses.fields(obj):
            rows.append((f"{section.name}.{f.name}", getattr(obj, f.name), f.metadata["doc"]))
    return rows


def replace_settings(config: Config, section: str, **changes: Any) -> Config:
    """A copy of `config` with some settings of one section changed, validated as a file's
    would be (`replace_settings(config, "broker", port=0)`)."""
    current = getattr(config, section)
    data = {section: {**dataclasses.asdict(current), **changes}}
    merged: dict[str, Any] = {
        name: dataclasses.asdict(getattr(config, name)) for name in section_defaults()
    }
    merged["destinations"] = {t.pattern: dict(t.items()) for t in config.destinations}
    merged["quotas"] = {
        q.name: {k: v for k, v in dataclasses.asdict(q).items() if k != "name"}
        for q in config.quotas
    }
    merged.update(data)
    merged["security"]["acl"] = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(e).items()}
        for e in config.acl
    ]
    return config_from_mapping(merged)
