"""Pipeline schedules, simulated: Megatron's 1F1B and interleaved 1F1B.

Owns the schedule orders (:mod:`._orders`: 1F1B, Megatron-Core's interleaved
order of today and the one before November 2024, the micro-batch group size),
the event simulator (:func:`simulate`), the batched
simulator (:func:`iteration_times`, bit-identical to it; :func:`iteration_time` picks the
quicker of the two for one pipeline), the in-flight
tables the memory model reads (:func:`in_flight_table`), and the timeline of
a solved split (per-chunk times from its plan, validated; a summary, the JSON record).
It needs only the engine's checks and work limit (a batch's simulation counts against
it): the search and everything above read it.
"""
from ._orders import (MAX_OPS, SCHEDULES, OpSequence, Waves, check_ops, check_schedule, levels, order, schedule_table,
                      sequence)
from ._simulate import (WAVES_FROM, Op, Timeline, bound_iteration_times, check_batch, in_flight_table, iteration_time,
                        iteration_times, simulate, unbounded_iteration_times)
from ._timeline import (
                        MAX_TIMELINE_OPS,
                        ChunkTimes,
                        check_model,
                        chunk_times,
                        of_plan,
                        of_split,
                        plan_options,
                        record,
                        simulated_plans, simulated_times,
                        stage_forward_backward,
                        summary,
                        timeline_of,
)

__all__ = [
    "SCHEDULES", "OpSequence", "Waves", "check_ops", "check_schedule", "levels", "order", "schedule_table", "sequence",
    "MAX_OPS", "WAVES_FROM", "Op", "Timeline", "bound_iteration_times", "in_flight_table", "iteration_time", "iteration_times",
    "simulate", "check_batch", "unbounded_iteration_times",
    "MAX_TIMELINE_OPS", "ChunkTimes", "check_model", "chunk_times", "plan_options", "of_plan", "of_split", "record", "simulated_plans", "simulated_times", "stage_forward_backward", "summary", "timeline_of",
]
