# For setup.py's Cython build only: these classes of backlog.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Backlog:
    cdef public object _entries, _jobs, _sizes, _priorities, _span, _gangs, _singles, _types, asking_types
