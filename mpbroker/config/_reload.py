"""What SIGHUP may change without a restart, and how each component applies it.

The supervisor reads the configuration again, keeps only the reloadable settings
(`reload_flow_settings`), checks the memory budget and hands the result to the workers
(a file and a generation counter in the control block). Each component then applies what
concerns it:

- gateways: `flow.send_timeout_ms` and the rate-based flow settings ([flow] and
  [destinations]) for SENDs from then on; held SENDs and paced producers go on with what
  they started with;
- p2p pipelines: the VolQueueStore's and PersQueueStore's watermarks (every queue judged
  again at once), the expiry policies of queues, the consumer byte window of new
  subscriptions, the paging marks;
- pubsub pipelines: the topic live buffer's and the topic store's watermarks, the expiry
  policies of stored topic messages, the consumer byte window of new subscriptions.

Everything else (ports, worker counts, store and ring sizes, quotas) needs a restart; the
log names each such setting that changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from ._schema import Config, sections
from ._validate import check_consistency, check_security

__all__ = ["RELOADABLE_FIELDS", "RELOADABLE_SECTIONS", "reload_flow_settings"]

RELOADABLE_SECTIONS: Final = ("flow", "vol_queue_store", "pers_queue_store", "topic_store")
RELOADABLE_FIELDS: Final = {
    "topics": (
        "live_msg_high",
        "live_msg_low",
        "global_live_msg_high",
        "global_live_msg_low",
        "global_live_byte_high",
        "global_live_byte_low",
    ),
    "queues": ("expiry_policy", "expiry_log_fields", "expiry_destination"),
}


def reload_flow_settings(old: Config, new: Config) -> tuple[Config, list[str]]:
    """`old` with the flow settings of `new` (validated together), and the settings that
    changed but only take effect after a restart."""
    changes: dict[str, Any] = {}
    ignored: list[str] = []
    for section in sections():
        name = section.name
        before, after = getattr(old, name), getattr(new, name)
        if name in RELOADABLE_SECTIONS:
            changes[name] = after
            continue
        keep = RELOADABLE_FIELDS.get(name, ())
        changes[name] = dataclasses.replace(before, **{k: getattr(after, k) for k in keep})
        ignored += [
            f"{name}.{f.name}"
            for f in dataclasses.fields(before)
            if f.name not in keep and getattr(before, f.name) != getattr(after, f.name)
        ]
    if old.quotas != new.quotas:
        ignored.append("quotas")
    # Who may read and write what is reloaded whole, like the users file.
    effective = Config(**changes, destinations=new.destinations, quotas=old.quotas, acl=new.acl)
    check_consistency(effective)
    # The entries are reloaded, the users file setting is not: entries must not come into
    # force on a broker whose logins are not checked.
    check_security(effective)
    return effective, ignored
