# For setup.py's Cython build only: these classes of engine.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Environment:
    cdef public object _now, _heap, _seq

cdef class SimJob:
    cdef public object trace, quota, queue, priority, checkpoint, remaining, status, ready_at, wait
    cdef public object first_start, end, start, attempt, preemptions, busy, lost, in_quota, reclaim
    cdef public object job, stop_fail, message, estimate_factor

cdef class _Usage:
    cdef public object name, capacity, queue, used, pending_gpus, pending_jobs, last, busy_area
    cdef public object in_area, over_area, preemptions, index, cohorts

cdef class _QueueRun:
    cdef public object queue, hosts, host_gpus, host_used, largest_host, running, pending, used
    cdef public object decide_at, checkpoints, timed, wake_at, instant, at_instant, type_used, host_type

cdef class Simulator:
    cdef public object cohort_usage, decide_fn, decisions, env, holds, jobs, on_progress, placed
    cdef public object progress_every, queues, quota_file, setup, start, timeline, usage, _arrivals
