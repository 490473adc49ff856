"""When the engine hands mlx's cached free buffers back to the device.

mlx keeps the buffers that arrays free for reuse, up to its cache limit (the budget sets it to a
step's working memory, engine_worker.sched.memory). A continuous batch frees buffers of new sizes
at every join and finish (KV caches of every length), which later steps rarely reuse, so the
cache sits near its limit and the device's peak is the live arrays plus that limit. vllm-mlx's
scheduler clears it after every step in which a request finished and every 32 steps, and so does
this engine: the device's peak is then about the live arrays (docs/benchmarks.md, "The job path at
load", has the A/B).
"""

from __future__ import annotations

from engine_worker.runner import device_memory

# Steps with requests running between two releases when nothing finishes (vllm-mlx's interval).
RELEASE_EVERY_STEPS = 32


class BufferRelease:
    """Counts the engine's busy steps and clears mlx's allocator cache by the rule above."""

    def __init__(self, every: int = RELEASE_EVERY_STEPS) -> None:
        if every <= 0:
            raise ValueError(f"every must be > 0, got {every}")
        self._every = every
        self._busy_steps = 0
        self.releases = 0

    def after_step(self, *, busy: bool, finished: bool) -> None:
        """On the engine thread, after a step: ``busy`` if it ran requests, ``finished`` if one ended."""
        if busy:
            self._busy_steps += 1
        if finished or (busy and self._busy_steps % self._every == 0):
            device_memory.clear_allocator_cache()
            self.releases += 1
