"""What the host gives the broker: usable CPUs, open files.

* `_cpus`: how many CPUs this process may really use (its CPU affinity and the cgroup v1/v2
  CPU quotas on its cgroup and every ancestor), for settings where 0 means "one worker per
  usable CPU". The parsing is pure; `usable_cpus` does the reading and never raises.
* `_files`: the open-file limit `broker.max_connections` needs, and raising the soft limit.
"""

from ._cpus import UsableCpus, count_from, parse_cfs, parse_cpu_max, usable_cpus
from ._files import FILES_PER_PROCESS, open_files_needed, raise_open_files

__all__ = [
    "FILES_PER_PROCESS",
    "UsableCpus",
    "count_from",
    "open_files_needed",
    "parse_cfs",
    "parse_cpu_max",
    "raise_open_files",
    "usable_cpus",
]
