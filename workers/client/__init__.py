"""What the commands share to talk to the workers and read a model: sending messages
(produce) and forgets, awaiting a verdict, a model's shard streams, reading mail from
files, maildirs and mbox files, a model's status, model files (export, import) and the
offline prediction from one."""
