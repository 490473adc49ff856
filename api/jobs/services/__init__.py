"""Writes of jobs. Every change of a job's state goes through a function of this package:
submission, dispatch, cancel, requeue, the engine workers' transitions (lifecycle.py), deletion;
queue_routing.py picks the queue a new job is sent to."""
