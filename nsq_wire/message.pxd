# Compiled (setup.py), MessageFields is an extension type: frames() reads its fields
# as C struct members. The timestamp and attempts are C integers (a timestamp is Go's
# int64 nanoseconds, attempts at most 65535): a message holds no Python int for them.
cdef class MessageFields:
    cdef public object body, id
    cdef public long long attempts, timestamp
