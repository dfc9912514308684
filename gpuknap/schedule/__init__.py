"""Pipeline schedules, simulated: Megatron's 1F1B and interleaved 1F1B.

Owns the schedule orders, the event simulator (:func:`simulate`), the batched
simulator (:func:`iteration_times`, bit-identical to it), the in-flight
tables the memory model reads (:func:`in_flight_table`), and the timeline of
a solved split (per-chunk times from its plan, a summary, the JSON record).
It needs nothing else of gpuknap: the search and everything above read it.
"""
from ._simulate import (
                        MAX_OPS,
                        SCHEDULES,
                        Op,
                        OpSequence,
                        Timeline,
                        in_flight_table,
                        iteration_times,
                        order,
                        sequence,
                        simulate,
)
from ._timeline import (
                        MAX_TIMELINE_OPS,
                        ChunkTimes,
                        chunk_times,
                        of_split,
                        record,
                        simulated_times,
                        stage_forward_backward,
                        summary,
                        timeline_of,
)

__all__ = [
    "MAX_OPS", "SCHEDULES", "Op", "OpSequence", "Timeline", "in_flight_table", "iteration_times", "order",
    "sequence", "simulate", "MAX_TIMELINE_OPS", "ChunkTimes", "chunk_times", "of_split", "record",
    "simulated_times", "stage_forward_backward", "summary", "timeline_of",
]
