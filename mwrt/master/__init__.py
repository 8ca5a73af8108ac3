"""The master's side: the cluster of nodes a script drives, tensor handles, placement,
streams and events, transfers, remote functions and master-issued collectives."""
