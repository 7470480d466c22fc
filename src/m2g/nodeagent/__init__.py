"""m2g's node agent: applies the per-GPU power limits m2g decides (GPUPowerLimit, see
m2g.model.powerlimit) through NVML, and reports the limit in force.

``nvml`` holds the device backends (the real one on nvidia-ml-py, a fake for KWOK, tests and
the twin, a read-only wrapper); ``core`` the per-node step. The loop with its API I/O lives in
m2g_controllers.nodeagent.
"""
