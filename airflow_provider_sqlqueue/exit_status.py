"""Exit statuses the console script (:mod:`.console`) and the commands (:mod:`.cli`) share.

A module of its own that imports nothing: the console script imports the commands, never the
other way round, and it must stay cheap to import.
"""

#: The exit status of a command ended by Ctrl-C: 128 + SIGINT, what shells report for it.
INTERRUPTED = 130
