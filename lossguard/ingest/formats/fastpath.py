"""The fast path for line formats: machine-written logs repeat one line shape millions of times.

Lines are cut into fields by polars' native string split on the format's field
separator (`,` between dict items, `|` between Megatron or build-nanogpt fields). One representative
line tells which field holds which key; every field column is then checked at once (does each cell
start with that key? does a field that holds no pair hold none anywhere?) and its numbers parsed
column-wise. A line that does not fit the shape (other keys, a comma inside a string, an eval line
among train lines) goes to the generic regex path instead, so the fast path changes speed, never
results: the same cell regex decides what a pair is on both paths.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from .pairs import EMPTY_PAIRS

MIN_LINES = 200
"""Fewer lines than this take the regex path: below it the fast path's fixed cost (~1.4 ms a call:
its expressions run over a dozen columns) is more than the regex costs."""


def fast_pairs(lines: pl.DataFrame, **options: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(pairs line_no/key/value of the lines that fit the shape, the lines left for the slow path):
    fast_wide's pairs laid out long."""
    wide, rest = fast_wide(lines, **options)
    return wide.pairs(), rest


def fast_wide(
    lines: pl.DataFrame,
    *,
    sep: str,
    cell_re: str,
    strip: str = " ",
    first_field_free: bool = False,
    one_pair_per_field: bool = False,
    separator: str | None = None,
    keep: Callable[[str], bool] | None = None,
    min_lines: int | None = None,
) -> tuple[Wide, pl.DataFrame]:
    """(the pairs of the lines that fit the shape, a row per line and a column per field, the lines
    left for the slow path).
    `cell_re` finds one pair in a field, with the named groups `key` and `value`; with
    `first_field_free` the text before the first separator is never a pair (Megatron's iteration);
    `one_pair_per_field` when the syntax guarantees it (JSON, Megatron), which saves a regex pass.
    `separator`: what `cell_re` allows between a key and its number (a regex allowing any spacing
    around its mark), so that a quick read of a cell separated so says the regex finds that one pair.
    `keep` (a projection: key -> is it needed): the pairs of other keys may be left out, never all
    of a line's (a line with pairs is a record, counted and placed whatever it holds), so only the
    needed fields' numbers are parsed, and the others' only on lines where no needed one has a value."""
    min_lines = MIN_LINES if min_lines is None else min_lines
    if lines.height < min_lines:
        return _NO_WIDE, lines
    texts = lines.get_column("text").fill_null("")
    # Separators are counted on the first lines only (which say the shape); every line's count is
    # read off its cut (_cut), without a pass over the whole text.
    seps = texts.head(1000).str.count_matches(sep, literal=True)
    cells = _cut(texts, seps, sep=sep)
    if cells is None:
        return _NO_WIDE, lines
    shape = _shape(cells, seps, cell_re=cell_re, strip=strip, first_field_free=first_field_free, one_pair_per_field=one_pair_per_field, separator=separator)
    if shape is None:
        return _NO_WIDE, lines
    free, fields = shape
    wanted = [f for f in fields if keep is None or keep(f.key)] or fields
    read, fits = _fitting(cells, free, fields, wanted, sep=sep, strip=strip)
    n_fit = int(fits.sum())
    if not n_fit:
        return _NO_WIDE, lines
    every = n_fit == fits.len()
    values = read.drop("fits") if every else read.filter(fits).drop("fits")
    kept = cells if every else cells.filter(fits)
    wanted, values, still = _numbers_wanted(kept, values, fields, wanted, cell_re=cell_re, strip=strip)
    return _taken(lines, fits, every, [f.key for f in wanted], values, still)


def _fitting(
    cells: pl.DataFrame, free: list[tuple[int, pl.Expr]], fields: list[_Field], wanted: list[_Field], *, sep: str, strip: str
) -> tuple[pl.DataFrame, pl.Series]:
    """The quick reads of the `wanted` fields (_quick_read, a column `fits` first) and which lines
    are of the shape (_shape's `free` cells and `fields`): those whose last field is whole and that
    pass the checks, each asked as cheaply as what it must rule out allows."""
    counts = [f.count for f in fields if f.count is not None]
    # A quick read of a field the regex can not read otherwise (_Field.trusted) says its cell holds
    # one pair: the count, a regex pass a field, is then asked only of lines where a quick read failed.
    later = bool(counts) and len(wanted) == len(fields) and all(f.trusted for f in fields)
    # A field left out is only checked for its key, on its cell as cut (_Field.loose: no stripped
    # copy of the cell); a line failing that is asked the exact check below. (A count reads the
    # stripped cell anyway.)
    chosen = {id(f) for f in wanted}
    loosely = [f for f in fields if id(f) not in chosen and f.loose is not None] if not counts else []
    # A needed field read lean (_Field.lean) is checked the same way, for its own longer prefix.
    leanly = [f for f in wanted if f.lean is not None] if not counts else []
    skipped = {id(f) for f in loosely + leanly}
    loose = [f.loose for f in loosely] + [f.lean[0] for f in leanly]
    exact = [c for _, c in free] + [c for f in fields for c in f.checks]
    checks = [c for _, c in free] + [c for f in fields if id(f) not in skipped for c in f.checks] + loose
    also = [i for i, _ in free] + [f.index for f in fields if id(f) not in skipped]
    read = _quick_read(cells, strip, wanted, checks if later else checks + counts, also=also, lean=not counts)
    last = pl.col(cells.columns[-1])
    whole = cells.select(last.is_not_null() & ~last.str.contains(sep, literal=True)).to_series()
    fits = read.get_column("fits") & whole
    if loose:
        odd = ~fits & whole
        if odd.any():
            again = _stripped_cells(cells.filter(odd), strip, [i for i, _ in free] + [f.index for f in fields])
            one = again.select(pl.all_horizontal(exact + counts).fill_null(False)).collect()
            fits = fits.scatter(odd.arg_true(), one.to_series())
    if later:
        odd = fits & read.select(pl.any_horizontal(pl.exclude("fits").is_null())).to_series()
        if odd.any():
            one = cells.filter(odd).lazy().select([_stripped(i, strip) for i in range(cells.width)]).select(pl.all_horizontal(counts)).collect()
            fits = fits.scatter(odd.arg_true(), one.to_series().fill_null(False))
    return read, fits


def _numbers_wanted(
    kept: pl.DataFrame, values: pl.DataFrame, fields: list[_Field], wanted: list[_Field], *, cell_re: str, strip: str
) -> tuple[list[_Field], pl.DataFrame, pl.Series | None]:
    """(the fields read, their numbers on the lines of the shape, which lines still are: _numbers):
    the `wanted` fields' (`values`: their quick reads), or every field's where a line's wanted ones
    hold none: its other pairs make it a record."""
    values, still = _numbers(kept, values, wanted, cell_re)
    if len(wanted) < len(fields) and values.select(pl.all_horizontal(pl.all().is_null()).any()).item():
        lean = all(f.count is None for f in fields)  # (as _fitting read them)
        values, still = _numbers(kept, _quick_read(kept, strip, fields, lean=lean), fields, cell_re)
        return fields, values, still
    return wanted, values, still


def _taken(lines: pl.DataFrame, fits: pl.Series, every: bool, keys: list[str], values: pl.DataFrame, still: pl.Series | None) -> tuple[Wide, pl.DataFrame]:
    """The pairs of the lines of the shape (`fits`; `every`: all), and the lines left for the regex
    path: those not of the shape, and those where it found another key's pair (`still` false)."""
    line_nos = lines.get_column("line_no").to_numpy()
    line_nos = line_nos if every else line_nos[fits.to_numpy()]
    if still is not None:
        values, line_nos = values.filter(still), line_nos[still.to_numpy()]
        fits = fits.scatter(fits.arg_true().filter(~still), False)
        every = False
    return Wide(line_nos, keys, values), lines.clear() if every else lines.filter(~fits)


def _cut(texts: pl.Series, seps: pl.Series, *, sep: str) -> pl.DataFrame | None:
    """The lines cut into as many fields as most of the first ones have (`seps`: their separators;
    a progress bar glued to some lines adds separators to those only); None when there is no such
    shape. A line with more separators keeps them in its last field and one with fewer is padded
    with nulls: the last field tells that neither fits the shape."""
    common = seps.head(1000).mode().sort()
    width = int(common[-1] if common.len() else 0) + 1
    if width < 2:
        return None
    cells = texts.str.splitn(sep, width).struct.unnest()
    return cells.rename(dict(zip(cells.columns, [f"c{i}" for i in range(width)])))


@dataclass(frozen=True)
class _Field:
    key: str
    index: int
    """Which cell holds it."""
    checks: tuple[pl.Expr, ...]
    """What its stripped cell must pass for the line to be of the shape."""
    loose: pl.Expr | None
    """A cheaper test on the cell as cut that passes only where `checks` pass (it may fail where they
    pass: a line failing it is asked `checks`); None where no such test is known."""
    lean: tuple[pl.Expr, pl.Expr] | None
    """A test on the cell as cut that passes only where `checks` pass (as `loose`), and the number
    read off that cell where it passes: the representative's text up to the separator's mark is cut
    off and the rest, trimmed, cast, with no stripped copy of the cell and no stage (a third of the
    work of `quick`). Null where `quick`'s reading may differ from the regex's; None where not known."""
    stages: tuple[tuple[pl.Expr, ...], ...]
    """The intermediate columns of the quick read, stage by stage (see _quick_read)."""
    count: pl.Expr | None
    """Does the cell hold exactly one pair (None when the syntax says so)."""
    trusted: bool
    """Where the quick read finds a number, the regex finds that pair and no other in the cell."""
    quick: pl.Expr
    """The field's number, read without a regex (over the stages' columns)."""
    cell: pl.Expr
    """The field's text, for the regex where the quick read fails."""


def _stripped_cells(cells: pl.DataFrame, strip: str, used: list[int]) -> pl.LazyFrame:
    """The cells as cut (`c{i}`) and, for the `used` ones, stripped (`s{i}`): a cell no field or
    check reads (the free first field, a field left out) is not copied."""
    return cells.lazy().with_columns([_stripped(i, strip) for i in sorted(set(used))])


def _quick_read(
    cells: pl.DataFrame, strip: str, fields: list[_Field], checks: list[pl.Expr] | None = None, also: list[int] = (), *, lean: bool = True
) -> pl.DataFrame:
    """The quick numbers (`v0`, `v1`... one per field) and, given the checks, whether each line
    fits the shape (`fits`); `also`: other cells the checks read stripped; `lean`: fields that can be
    read lean (_Field.lean) are. Every intermediate string (the stripped cell `s{i}`, what follows
    the key...) is a column computed once, stage by stage: written as one expression per number,
    the engine recomputed each of them for every test that used it (5x the work on a kv line)."""
    staged = [f for f in fields if not lean or f.lean is None]
    query = _stripped_cells(cells, strip, [f.index for f in staged] + list(also))
    for depth in range(max((len(f.stages) for f in staged), default=0)):
        stage = [e for f in staged if depth < len(f.stages) for e in f.stages[depth]]
        if stage:
            query = query.with_columns(stage)
    fits = [pl.all_horizontal(checks).fill_null(False).alias("fits")] if checks is not None else []
    quick = [(f.lean[1] if lean and f.lean is not None else f.quick).alias(f"v{i}") for i, f in enumerate(fields)]
    return query.select(*fits, *quick).collect()


def _shape(
    cells: pl.DataFrame, seps: pl.Series, *, cell_re: str, strip: str, first_field_free: bool, one_pair_per_field: bool, separator: str | None = None
) -> tuple[list[tuple[int, pl.Expr]], list[_Field]] | None:
    """What a line of the common shape holds, read off one such line: the checks every line's fields
    holding no pair must pass to be of that shape (with the cell each reads), and the fields holding
    a pair (with their own checks). None when that line holds no pair or a field holding several
    (not this path's shape)."""
    first = (seps.head(500) == cells.width - 1).arg_true()
    if not first.len():
        return None
    pattern = re.compile(cell_re)
    checks: list[tuple[int, pl.Expr]] = []
    fields: list[_Field] = []
    for i, cell in enumerate(cells.row(int(first[0]))):
        if i == 0 and first_field_free:
            continue
        text = (cell or "").strip(strip)
        found = list(pattern.finditer(text))
        if len(found) > 1:
            return None
        if not found:
            checks.append((i, _no_pair(i, cell_re, strip)))
            continue
        m = found[0]
        # Everything before the number must read the same; only the number may change.
        literal = text[: m.start("value")].rstrip(" \t:=\"'(")
        if not literal:
            return None
        # The literal is the key, and what follows it the plain separator (no `[`): any spacing reads alike.
        plain = separator is not None and literal == text[: m.end("key")] and re.fullmatch(separator, text[m.end("key") : m.start("value")]) is not None
        lead = (cell or "")[: len(cell or "") - len((cell or "").lstrip(strip))]
        fields.append(_pair_field(i, literal, text[: m.start("value")], text[m.end("value") :], m.group("key").strip(), cell_re, strip, one_pair_per_field, plain, lead))
    return (checks, fields) if fields else None


def _cell(i: int, strip: str) -> pl.Expr:
    return pl.col(f"c{i}").fill_null("").str.strip_chars(strip)


@functools.lru_cache(maxsize=1024)
def _stripped(i: int, strip: str) -> pl.Expr:
    return _cell(i, strip).alias(f"s{i}")


# The expressions are built once per shape (a daemon parses the same shape every pass, a scan in
# every file; building them costs more than running them on a few hundred lines). They read the
# stripped cells, `s{i}` (_quick_read).
@functools.lru_cache(maxsize=1024)
def _no_pair(i: int, cell_re: str, strip: str) -> pl.Expr:
    return ~pl.col(f"s{i}").str.contains(cell_re)


@functools.lru_cache(maxsize=1024)
def _pair_field(
    i: int, literal: str, before: str, after: str, key: str, cell_re: str, strip: str, one_pair_per_field: bool, plain: bool = False, lead: str = ""
) -> _Field:
    col = pl.col(f"s{i}")
    checks = (col.str.starts_with(literal),)
    # The cell as cut starting with the representative's lead (strip characters only) and the literal
    # (which starts with none) is, stripped, the literal's start, unless stripping the end eats into
    # the literal (which the literal ending in no strip character rules out).
    loose = pl.col(f"c{i}").str.starts_with(lead + literal) if literal[-1] not in strip else None
    count = None if one_pair_per_field else col.str.count_matches(cell_re) == 1
    # The quick read takes a cell that is the representative's with only the number and the spacing
    # around the separator changed (the cast takes just what the regex's NUMBER matches whole);
    # anything else (a unit, a wrapper, another separator) goes to the regex, which then decides.
    gap = before[len(literal) :]
    mark = gap.strip()
    # `spaced`: what follows the key, from its first non-space (`rest` is what follows the key).
    spaced = pl.col(f"r{i}")
    stages: list[tuple[pl.Expr, ...]] = [(col.str.strip_prefix(literal).str.strip_chars_start().alias(f"r{i}"),)]
    if mark:
        stages.append((spaced.str.strip_prefix(mark).str.strip_chars_start().alias(f"a{i}"),))
        after_mark = pl.col(f"a{i}")
    else:
        after_mark = spaced
    same = col.str.starts_with(literal) & col.str.ends_with(after) & spaced.str.starts_with(mark)
    if not mark:
        # `name value`: some space between (`rest` is the cell less the literal, where it starts with it).
        same = same & (spaced.str.len_bytes() < col.str.len_bytes() - len(literal.encode()))
    if not mark.strip(":="):
        # `key: value`, `key=value`, `key value`: what the separator regexes allow, nothing more.
        same = same & ~after_mark.str.starts_with(":") & ~after_mark.str.starts_with("=")
    number = after_mark.str.strip_suffix(after) if after else after_mark
    stages.append((number.cast(pl.Float64, strict=False).alias(f"n{i}"),))
    value = pl.col(f"n{i}")
    # What the literal, the spacing and the number may be and still read as one pair, as the regex
    # reads it: the key, then the plain separator (`plain`: any spacing reads alike; a `[` allows
    # none after it); a unit that could carry the number on (`.5`, `e3`, digits) is left to the
    # regex; and `inf` or `nan` end at a word boundary, which a unit starting with a letter denies
    # (`infms` is no pair).
    carries_on = after[:1] in tuple("0123456789.eE")
    trusted = plain and not carries_on
    lean = _lean(i, lead + literal + gap.rstrip(), strip) if mark and not after and literal[-1] not in strip else None
    if carries_on:
        same = pl.lit(False)  # `1.2.3`: the regex reads `5.3` whole where cutting `.3` off would read 5
    elif re.match(r"\w", after[:1]):
        same = same & value.is_finite()
    return _Field(key, i, checks, loose, lean, tuple(stages), count, trusted, pl.when(same).then(value), _cell(i, strip))


def _lean(i: int, prefix: str, strip: str) -> tuple[pl.Expr, pl.Expr] | None:
    """_Field.lean for a field whose representative cell (as cut) is `prefix` (strip characters,
    the literal, the spacing and the mark), spacing, a number and strip characters. A cell starting
    with `prefix` reads as `quick` reads it (the literal, then the mark); what follows the mark is
    what the regex allows there, any spacing, then the number, which the cast takes only where the
    regex's NUMBER reads it whole. The ends trimmed off it are spacing (and strip characters, after
    the number only): characters that neither carry a number on nor join a word (`inf` ends at a
    word boundary), so the regex's number ends where the trimmed text ends."""
    if re.search(r"[\w.+-]", strip):
        return None
    cell = pl.col(f"c{i}")
    # Only whitespace before the number (the regex's `\s*`); strip characters after it too.
    rest = cell.str.slice(len(prefix)).str.strip_chars()
    if strip.strip():
        rest = rest.str.strip_chars_end(strip).str.strip_chars_end()
    starts = cell.str.starts_with(prefix)
    return starts, pl.when(starts).then(rest.cast(pl.Float64, strict=False))


def _numbers(kept: pl.DataFrame, values: pl.DataFrame, fields: list[_Field], cell_re: str) -> tuple[pl.DataFrame, pl.Series | None]:
    """Each field's number on the lines of the shape (`values`: the quick reads, a column per field);
    where the quick read fails (a unit after the number, say), the regex decides, and where the pair
    it finds is another key's, the line is not of the shape after all (the second value: which lines
    still are, or None when all)."""
    nulls = values.null_count().row(0)
    if not any(nulls):
        return values, None
    still = None
    for i, (field, n) in enumerate(zip(fields, nulls)):
        if n:
            missing = values.get_column(f"v{i}").is_null()
            pair = field.cell.str.extract_groups(cell_re)  # one regex pass for both groups
            found = kept.filter(missing).select(
                pair.struct.field("key").str.strip_chars().alias("key"),
                pair.struct.field("value").cast(pl.Float64, strict=False).alias("value"),
            )
            values = values.with_columns(values.get_column(f"v{i}").scatter(missing.arg_true(), found.get_column("value")))
            other = (found.get_column("key") != field.key).fill_null(False) & found.get_column("value").is_not_null()
            if other.any():
                wrong = pl.Series([False] * kept.height).scatter(missing.arg_true().filter(other), True)
                still = ~wrong if still is None else still & ~wrong
    return values, still


def _long_pairs(line_nos: np.ndarray, keys: list[str], values: pl.DataFrame) -> pl.DataFrame:
    """(line_no, key, value) from a frame of values, a row per line and a column per key, row by
    row as the file reads; a missing value is no pair."""
    index, key, value, _ = _melted(line_nos, keys, values)
    return pl.DataFrame(
        {"line_no": pl.Series(index, dtype=pl.Int64()).set_sorted(), "key": key, "value": value},
        schema={"line_no": pl.Int64(), "key": pl.Categorical(), "value": pl.Float64()},
    )


def long_rows(steps: np.ndarray, keys: list[str], values: pl.DataFrame, line_nos: np.ndarray) -> pl.DataFrame:
    """Raw rows (step, tag, value, wall_time, line_no) from a frame of values, a row per line (at
    `steps`, from `line_nos`) and a column per key, row by row as the file reads; a missing value is no row."""
    index, key, value, valid = _melted(steps, keys, values)
    lines = np.repeat(line_nos, len(keys))
    return pl.DataFrame(
        {"step": index, "tag": key, "value": value}, schema={"step": pl.Int64(), "tag": pl.Categorical(), "value": pl.Float64()}
    ).with_columns(pl.lit(None, dtype=pl.Float64()).alias("wall_time"), pl.Series("line_no", lines if valid is None else lines[valid], dtype=pl.Int64()))


def _melted(index: np.ndarray, keys: list[str], values: pl.DataFrame) -> tuple[np.ndarray, pl.Series, np.ndarray, np.ndarray | None]:
    """Row-major (index, key, value) of the non-null cells of `values`, and which cells those are
    (None: all)."""
    k = len(keys)
    matrix = values.to_numpy().astype(np.float64, copy=False).ravel()
    codes = np.tile(np.arange(k, dtype=np.uint32), index.size)
    index = np.repeat(index, k)
    valid = None
    if any(values.null_count().row(0)):
        valid = values.select(pl.all().is_not_null()).to_numpy().ravel()
        index, codes, matrix = index[valid], codes[valid], matrix[valid]
    return index, pl.Series(keys, dtype=pl.Categorical()).gather(pl.Series(codes)), matrix, valid


_NESTED = (pl.Struct, pl.List, pl.Array, pl.Object)
INFER_LINES = 1000
"""Lines the NDJSON reader infers its columns from."""
WIDE, SPARSE = 256, 8
"""A frame wider than WIDE columns must hold a value in at least 1 cell of SPARSE."""


def _too_sparse(head: pl.Series) -> bool:
    """Would the NDJSON reader's frame be mostly empty cells? It has a column for every key of the
    lines it infers from and a row for every line, so a log whose lines each bring new keys (20,000
    distinct keys over 2,000 lines) makes it lines x keys cells, growing with the square of the file
    (4.5 minutes and 500 MB for 364 KB). Such a log goes to the regex path, whose cost follows the
    pairs. A bounded width is linear whatever the fill, so only a frame both wide and sparse is
    refused; counted on the inferred lines with one cheap regex."""
    keys = head.str.extract_all(r'"[^"\n]*"\s*:').explode().n_unique()
    if keys <= WIDE:
        return False
    pairs = int(head.str.count_matches('":', literal=True).sum() or 0)
    return keys * head.len() > SPARSE * pairs


def _ndjson(raw: bytes) -> pl.DataFrame:
    """The NDJSON reader's frame of `raw`. Python's json writes NaN and Infinity bare, which no JSON
    parser accepts: only when the reader refuses the block are they quoted and the block read again
    (looking for them first cost two scans of every block, with or without them)."""
    try:
        return pl.read_ndjson(raw, infer_schema_length=INFER_LINES)
    except pl.exceptions.PolarsError:
        quoted = raw
        if b"NaN" in quoted:
            quoted = quoted.replace(b": NaN", b': "NaN"')
        if b"Infinity" in quoted:
            quoted = quoted.replace(b": -Infinity", b': "-Infinity"').replace(b": Infinity", b': "Infinity"')
        if quoted is raw or quoted == raw:
            raise
        return pl.read_ndjson(quoted, infer_schema_length=INFER_LINES)


@dataclass(frozen=True)
class Wide:
    """Pairs as the NDJSON reader gives them: a row per line (`line_no`), a column per key (`keys`),
    null where the line has no such pair."""

    line_no: np.ndarray
    keys: list[str]
    values: pl.DataFrame

    def pairs(self) -> pl.DataFrame:
        """(line_no, key, value), line by line, each line's pairs in key order."""
        return _long_pairs(self.line_no, self.keys, self.values) if self.keys else EMPTY_PAIRS


_NO_WIDE = Wide(np.zeros(0, dtype=np.int64), [], pl.DataFrame())


def json_wide(lines: pl.DataFrame, *, raw: bytes | None = None, min_lines: int | None = None) -> tuple[Wide, pl.DataFrame]:
    """JSON lines through polars' native NDJSON reader. A line counts as read only if the reader
    kept every one of its keys (as many cells as `":` in the line): a key the schema inference did not
    see, a nested object, a duplicate key, all send that line to the regex path instead."""
    min_lines = MIN_LINES if min_lines is None else min_lines
    if lines.height < min_lines:
        return _NO_WIDE, lines
    texts = lines.get_column("text").fill_null("")
    objects = texts.str.starts_with("{")
    if _too_sparse(texts.filter(objects).head(INFER_LINES)):
        return _NO_WIDE, lines
    if not objects.all():
        raw = None
    if raw is None:
        raw = texts.filter(objects).str.join("\n").item().encode("utf-8") + b"\n"
    try:
        frame = _ndjson(raw)
    except pl.exceptions.PolarsError:
        return _NO_WIDE, lines
    chosen = lines.filter(objects)
    if frame.height != chosen.height or not frame.width:
        return _NO_WIDE, lines
    chosen_text = chosen.get_column("text")
    expected = chosen_text.str.count_matches('":', literal=True) - chosen_text.str.count_matches('": null', literal=True)
    present = frame.select(pl.sum_horizontal(pl.all().is_not_null())).to_series()
    # The schema once: polars builds it anew on every `frame.schema`, a cost of the frame's width,
    # which asked once per column made a wide frame quadratic.
    schema = frame.schema
    nested = [c for c, t in schema.items() if isinstance(t, _NESTED) or t in _NESTED]
    fits = present == expected
    for c in nested:
        fits = fits & frame.get_column(c).is_null()
    numeric = [c for c, t in schema.items() if c not in nested and t != pl.Boolean]
    values = frame.select([
        (pl.col(c).str.strip_chars("\"").cast(pl.Float64, strict=False) if schema[c] == pl.String else pl.col(c).cast(pl.Float64))
        for c in numeric
    ])
    if fits.all():
        return Wide(chosen.get_column("line_no").to_numpy(), numeric, values), lines.filter(~objects)
    line_nos = chosen.get_column("line_no").to_numpy()[fits.to_numpy()]
    rest = pl.concat([lines.filter(~objects), chosen.filter(~fits)]).sort("line_no")
    return Wide(line_nos, numeric, values.filter(fits)), rest
