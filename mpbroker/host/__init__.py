"""What the host gives the broker: usable CPUs.

* `_cpus`: how many CPUs this process may really use (its CPU affinity and the cgroup v1/v2
  CPU quotas on its cgroup and every ancestor), for settings where 0 means "one worker per
  usable CPU". The parsing is pure; `usable_cpus` does the reading and never raises.
"""

from ._cpus import UsableCpus, count_from, parse_cfs, parse_cpu_max, usable_cpus

__all__ = ["UsableCpus", "count_from", "parse_cfs", "parse_cpu_max", "usable_cpus"]
