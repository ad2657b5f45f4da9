"""The pipeline-parallel engine.

Data flows generate -> lower -> validate/simulate/render (`paddle_ext.pipeline.schedule`,
pure Python, importable without Paddle) -> runtime -> fleet glue. This package module
itself must stay free of Paddle imports: it re-exports only the schedule layer.
"""

from paddle_ext.pipeline.schedule import (
    Costs,
    Schedule,
    ScheduleError,
    generate,
    lower,
    simulate,
    validate,
)

__all__ = ["Costs", "Schedule", "ScheduleError", "generate", "lower", "simulate", "validate"]
