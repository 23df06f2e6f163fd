# compiled (setup.py): Message is an extension type, its fields C struct members here
from nsqd_tw.core.message cimport Message
