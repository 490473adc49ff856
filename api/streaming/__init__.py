"""Following a job's stream on the web side: the relay that reads a job's Redis stream for one
client, the message shapes of that stream, and the end of a job that never reached a worker."""
