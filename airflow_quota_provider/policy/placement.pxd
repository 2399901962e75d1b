# For setup.py's Cython build only: these classes of placement.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Placement:
    cdef public object _at_least, _by_free, _hosts, _by_settled, _labels, down, free_now, free_settled, gpus, largest, names
