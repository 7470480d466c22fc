"""The planner: pure functions from a factory snapshot, the queues and a policy set to a plan.

No I/O, no clock, no cluster access: controllers build the snapshot, call the planner and apply
the plan it returns.
"""
