"""The engine: :class:`~.core.EngineCore` runs the scheduler on one engine thread that owns mlx,
and takes requests and aborts from any thread through its command queue.

* :mod:`.core`: the engine thread, its life cycle and the synchronous host API;
* :mod:`.async_api`, :mod:`.async_engine`: the seed's asyncio API and ``AsyncEngineCore``;
* :mod:`.collectors`: where a request's outputs wait for an asyncio or a blocking consumer;
* :mod:`.ownership`: which engine owns a model; :mod:`.heap`: the start-up heap freeze.
"""
