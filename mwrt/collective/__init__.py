"""Process groups and the collectives written once over any channel's point-to-point: the
group (ranks, tags, sequence numbers), the agreement check, the algorithms, reductions."""
