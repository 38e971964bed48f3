"""What goes on the streams: the wire codec of input entries, the outputs and dead letters
workers write, explanations as an output carries them, learn-once keys, stream ids and
replies."""
