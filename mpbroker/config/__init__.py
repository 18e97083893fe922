"""Broker configuration: defaults, TOML loading, validation and what SIGHUP reloads. Pure.

Every setting has a default, so no file is needed; an unknown key or a bad value is refused
with a `ConfigError` that names the key, the value and what is allowed.

* `_schema`: the sections, their settings with unit, default, range and documentation; `Config`.
* `_units`: KiB/MiB/GiB, `parse_size`, `format_bytes` (the one definition of each).
* `_values`: settings that are small languages (MemWatch levels, expiry log fields, the
  disk free limit).
* `_load`: TOML and mappings in, a validated `Config` out; `replace_settings`.
* `_validate`: limits that contradict each other.
* `_reload`: what SIGHUP may change, and how each component applies it.
"""

from ._errors import ConfigError
from ._load import config_from_mapping, iter_settings, load_config, replace_settings
from ._reload import RELOADABLE_FIELDS, RELOADABLE_SECTIONS, reload_flow_settings
from ._schema import (
    ACL_PERMISSIONS,
    DEFAULT_QUOTA,
    DESTINATION_KEYS,
    LOG_FORMATS,
    LOG_LEVELS,
    AclEntry,
    AdminSettings,
    BrokerSettings,
    CompressionSettings,
    Config,
    DestinationSettings,
    FlowSettings,
    MemorySettings,
    QueueSettings,
    QuotaConfig,
    ReplaySettings,
    RingSettings,
    SecuritySettings,
    SelectorSettings,
    StompSettings,
    StoreFlowSettings,
    StoreSettings,
    TempStoreSettings,
    TopicSettings,
    TransactionSettings,
)
from ._units import GiB, KiB, MiB, format_bytes, parse_size
from ._values import DiskFreeLimit, MemLevel, parse_disk_free_limit, parse_levels, parse_log_fields

__all__ = [
    "ACL_PERMISSIONS",
    "DEFAULT_QUOTA",
    "DESTINATION_KEYS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "RELOADABLE_FIELDS",
    "RELOADABLE_SECTIONS",
    "AclEntry",
    "AdminSettings",
    "BrokerSettings",
    "CompressionSettings",
    "Config",
    "ConfigError",
    "DestinationSettings",
    "DiskFreeLimit",
    "FlowSettings",
    "GiB",
    "KiB",
    "MemLevel",
    "MemorySettings",
    "MiB",
    "QueueSettings",
    "QuotaConfig",
    "ReplaySettings",
    "RingSettings",
    "SecuritySettings",
    "SelectorSettings",
    "StompSettings",
    "StoreFlowSettings",
    "StoreSettings",
    "TempStoreSettings",
    "TopicSettings",
    "TransactionSettings",
    "config_from_mapping",
    "format_bytes",
    "iter_settings",
    "load_config",
    "parse_disk_free_limit",
    "parse_levels",
    "parse_log_fields",
    "parse_size",
    "reload_flow_settings",
    "replace_settings",
]
