"""The factory telemetry simulator's model: what KWOK nodes *would* draw and how hot they'd get.

Pure except ``data`` (loads the measured power curves). ``power`` gives per-GPU watts from the
workload kind and power-cap fraction (Emerald AI DVFS sweep, H200 recording, scaled to a GB300);
``thermal`` the first-order temperatures; ``faults`` the injectable conditions; ``model`` the
state and ``step``; ``exposition`` renders a state as DCGM-named and facility metrics.
See docs/signals.md for sources, assumptions and the measured fit.
"""
