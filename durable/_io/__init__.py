"""The I/O: the system database (the only place SQL runs), its connection, its
listeners, this process's ownership, outages, group commit and retention."""
