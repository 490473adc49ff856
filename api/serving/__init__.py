"""What serves the jobs, seen from the web side: the models jobs may name (catalog.py) and their
tokenizers, the engine workers serving them as their heartbeats in Redis say (workers.py,
worker_history.py), and ``GET /api/v1/models``. (The workers' own side is api/worker/.)"""
