"""What the daemon keeps in Redis and how it talks to it: clients and their access check,
key names, the stored model config, the atomic commit and its Lua scripts, the label
cache, the trim of ``:in``, the embedded Redis of the demo."""
