# Compiled (setup.py), Message is an extension type: the modules that cimport it
# read and write its fields as C struct members. The times are C doubles and the
# owner's ID a C integer (the .py's Message holds floats and an int there), so the
# in-flight bookkeeping keeps no Python object per message but its bucket and ref.
from nsq_wire.message cimport MessageFields


cdef class Message(MessageFields):
    cdef public object bucket, ref
    cdef public double deferred, delivery_ts, pri
    cdef public long long client_id
