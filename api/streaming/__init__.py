"""Streaming of job outputs: the engine worker's sink (Redis stream + channel layer + DB), the
wire messages WebSocket clients receive, and the worker process's service object."""
