"""The staff-only engine dashboard (``/admin/engine/``): the workers, their running requests,
caches, memory and throughput, and the eviction of a prefix-cache entry."""
