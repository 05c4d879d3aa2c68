"""What every engine integration shares; nothing here imports or names an engine.

:mod:`.alpha` (the α-source contract), :mod:`.shadow_alpha` and :mod:`.worlds_alpha` (adaptive α
sources), :mod:`.shadow_process` (a lagged shadow's replay in a child process), :mod:`.prefix_delta` (a finished
request's tokens rebuilt from the prefixes already seen), :mod:`.server` (a server as a child process),
:mod:`.client` (a streaming completions client), :mod:`.bench` (the bench's engine-free half). Import from those modules; this package
imports none of them (the client and the server need ``httpx`` only when they run).
"""
