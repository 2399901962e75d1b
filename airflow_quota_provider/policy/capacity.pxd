# For setup.py's Cython build only: these classes of capacity.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Usage:
    cdef public object capacity, quotas, used, physical, common, supply, borrowed_total, tree

cdef class TreeUsage(Usage):
    cdef public object node_used, borrow_starts
