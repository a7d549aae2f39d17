"""Talking to peers within bounds: bounded reads, binding a listening socket, the kernel's receive stamps."""
