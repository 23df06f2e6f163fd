# Compiled (setup.py), Message is an extension type: the modules that cimport it
# read and write its fields as C struct members. Every field is a Python object,
# so it holds what the .py's Message holds.
cdef class Message:
    cdef public object attempts, body, bucket, client_id, deferred, delivery_ts, id, pri, ref, timestamp
