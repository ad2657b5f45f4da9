"""Communication helpers: transports on gloo and NCCL, tracing, hang reports."""
