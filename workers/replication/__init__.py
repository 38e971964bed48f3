"""One model held by many workers: the replica (snapshot + log), the snapshot lease,
the ordering of labelled batches across workers, statistics shards."""
