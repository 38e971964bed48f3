"""What the commands share to talk to the workers: sending messages (produce), awaiting
a verdict, a model's shard streams, reading mail from files, maildirs and mbox files, model
files."""
