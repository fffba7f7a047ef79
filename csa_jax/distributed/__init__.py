"""Distribution: the device mesh and its sharding rules (mesh.py), what several processes of
one program share, split and reduce (processes.py), and N local processes run as the hosts
of a pod slice would run them (multiprocess_local.py). The lowest layer of the library: it
imports nothing else of it."""
