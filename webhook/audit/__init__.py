"""Background audit: existing objects judged by the admission engine, written as PolicyReports."""
