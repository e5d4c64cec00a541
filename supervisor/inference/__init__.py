"""The inference request/response types and tensor helpers every supervisor layer shares (below the
schedulers and instances, above only inferd.worker.wire)."""
