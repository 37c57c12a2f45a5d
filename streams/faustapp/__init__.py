"""What every loopwarden Faust app shares, the worker (streams/worker/) and
the fleet stage (streams/fleet/): the app's defaults and web server, the
Faust worker that runs it, its start-up checks and rebalance lines (``app``),
and the RocksDB table store with its idle sweep (``table``)."""
