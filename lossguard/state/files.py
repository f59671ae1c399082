"""The state's reads of what the daemon follows: the files and how far each was read, and the tail
of each stream the next pass's windows continue from (from memory when a recent commit wrote it)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .columns import chunks, marks, path_of, stored, unpack_tail
from .rows import FileRow, Tail
from .transaction import Connected

_FILE = "SELECT path, run, format, device, inode, fingerprint, cursor, dead, quiet, mtime FROM files"


def _file_row(r: tuple) -> FileRow:
    return FileRow(path_of(r[0]), r[1], r[2], r[3], r[4], r[5] or b"", r[6], bool(r[7]), int(r[8]), r[9])


class FilesAndTails(Connected):
    """State's reads of the `files` and `streams` tables (a pass writes them through Transaction)."""

    def files(self, paths: Collection[str] | None = None) -> dict[str, FileRow]:
        """Every followed file, or only those of `paths` (a pass after inotify named what changed)."""
        if paths is None:
            rows = self.db.execute(_FILE).fetchall()
        else:
            rows = []
            for chunk in chunks(sorted(paths)):
                rows += self.db.execute(f"{_FILE} WHERE path IN ({marks(chunk)})", [stored(p) for p in chunk]).fetchall()
        return {path_of(r[0]): _file_row(r) for r in rows}

    def files_of_runs(self, runs: Collection[str]) -> dict[str, FileRow]:
        """The followed files of `runs` (the other files of runs inotify named one file of)."""
        rows = []
        for chunk in chunks(sorted(runs)):
            rows += self.db.execute(f"{_FILE} WHERE run IN ({marks(chunk)})", list(chunk)).fetchall()
        return {path_of(r[0]): _file_row(r) for r in rows}

    def tail(self, run: str, key: str) -> Tail:
        """A stream's committed tail (`key`: a canonical metric, or `tag:<tag>` for a context tag)."""
        cached = self._tails.get((run, key))
        if cached is not None:
            self._tails.move_to_end((run, key))
            return cached
        row = self.db.execute("SELECT tail, seen, timeline FROM streams WHERE run=? AND metric=?", (run, key)).fetchone()
        return Tail.empty() if not row else unpack_tail(*row)

    def tails_under(self, runs: Sequence[str], prefix: str) -> dict[tuple[str, str], Tail]:
        """Every tail of `runs` whose key starts with `prefix`, by (run, key): the keys a run keeps
        are its own (a loss's parts, named by the run's tags), not known before they are read."""
        out: dict[tuple[str, str], Tail] = {}
        for chunk in chunks(list(runs)):
            rows = self.db.execute(
                f"SELECT run, metric, tail, seen, timeline FROM streams WHERE substr(metric, 1, ?) = ? AND run IN ({marks(chunk)})", (len(prefix), prefix, *chunk)
            )
            for run, key, tail, seen, timeline in rows:
                out[(run, key)] = unpack_tail(tail, seen, timeline)
        return out

    def tails_of(self, runs: Sequence[str], keys: Sequence[str]) -> dict[tuple[str, str], Tail]:
        """`tail` of every (run, key) pair, in one query for those not in memory (a pass over
        hundreds of busy runs); a stream with no tail yet is left out."""
        out: dict[tuple[str, str], Tail] = {}
        missing: list[str] = []
        for run in runs:
            cached = [self._tails.get((run, key)) for key in keys]
            if any(t is None for t in cached):
                missing.append(run)
            out.update(((run, key), t) for key, t in zip(keys, cached) if t is not None)
        for chunk in chunks(missing):
            rows = self.db.execute(
                f"SELECT run, metric, tail, seen, timeline FROM streams WHERE metric IN ({marks(keys)}) AND run IN ({marks(chunk)})", (*keys, *chunk)
            )
            for run, key, tail, seen, timeline in rows:
                out.setdefault((run, key), unpack_tail(tail, seen, timeline))
        return out
