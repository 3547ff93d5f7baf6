"""`draguard assess`: a read-only inventory of a live cluster's GPU use, judged by the same engine
as admission and review. `collect` is the only module that talks to the API server."""
