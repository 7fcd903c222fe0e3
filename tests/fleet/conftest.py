"""Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported: "0" keeps every
address it resolves on loopback (127.0.0.1, never the machine's own address). Set here, before any
module of this directory imports Ray; no usage statistics are sent either."""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
