"""Judging: streams from the canonical table, rule kinds and their rule files, spikes, causes, and
`engine.judge`, the one judge `scan` and `watch` both call. Pure: frames in, dataclasses out, no
clock and no I/O beyond reading rule files, so the audit and the daemon can never disagree.

Named `detection`, not `detect`: `lossguard.detect` is the public function, and a subpackage of that
name would replace it as an attribute of the package the first time it was imported."""
