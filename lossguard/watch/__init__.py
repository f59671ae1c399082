"""`lossguard watch`: the daemon around the same judge `scan` runs. It adds only "when" (inotify and a
periodic rescan, the pass's time budget, systemd's notifications) and "what was done" (the state):
`follow` is one pass (`reads`, `tails`, `notices` and `stalls` its steps), `daemon` schedules passes
and deliveries, `metrics` serves what the state holds."""
