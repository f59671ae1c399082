"""Reading: where a run's bytes are (discovery, `sources/`), what they say (`formats/`, one module per
log format), and the one reader API over both (`reader.read`: a file and a cursor in, canonical rows
and the next cursor out). The canonical table, cursors, problems and the metric vocabulary live here
because every reader produces or needs them; nothing here knows about rules, reports or the daemon."""
