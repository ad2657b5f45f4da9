"""Communication helpers: transports on gloo and NCCL, tracing, hang reports.

`long_wait(seconds)`: a block whose communication may wait longer than
comm.hang_timeout without the watchdog calling it hung (docs/comm_debugging.md).
"""

from paddle_ext.comm.trace import long_wait

__all__ = ["long_wait"]
