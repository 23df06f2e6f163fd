# Compiled (setup.py), Message is an extension type: the modules that cimport it
# read and write its fields as C struct members. The fields it adds to the layout's
# are Python objects, so it holds what the .py's Message holds.
from nsq_wire.message cimport MessageFields


cdef class Message(MessageFields):
    cdef public object bucket, client_id, deferred, delivery_ts, pri, ref
