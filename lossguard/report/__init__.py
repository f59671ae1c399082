"""What `scan` and `read` tell people and programs: the audit of every run under a folder (`audit`),
its renderings (`scan_report`: table, JSON, Markdown, HTML with `svg` panels), the canonical rows
written out (`rows`), rule sets compared on the same history (`compare`), and where a command's output
goes (`output`)."""
