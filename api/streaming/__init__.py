"""Following a job's stream: the WebSocket consumers and the server-sent events that clients
follow a job with (consumers.py, sse.py), the relay that reads a job's Redis stream for one
client, the message shapes of that stream, the one function every writer appends to it with
(append.py), the end of a job that never reached a worker, and routing.py, which mounts the
Channels consumers (the OpenAI completions' too)."""
