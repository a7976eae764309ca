"""The canonical long tables (DESIGN.md): read them and check them against their contracts.

Row numbers in errors are 1-based data rows (the header is not counted); frames keep
them as their index so that errors raised after a join still point into the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.contracts import API_SUM_TOLERANCE, NA_ANSWERS, PROB_TOLERANCE, SPECS
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric, option_key
from llmrubric.io.rubric_arg import as_rubric

log = logging.getLogger(__name__)


def source_of(df: pd.DataFrame) -> str:
    return str(df.attrs.get("source", "<table>"))


def read_raw(path: str | Path) -> pd.DataFrame:
    """A table file as read, unchecked (CSV/TSV cells as strings); rows numbered from 1 as in error
    messages, ``attrs["source"]`` the path."""
    path = Path(path)
    df = _parse(path)
    df.index = pd.RangeIndex(1, len(df) + 1)
    df.attrs["source"] = str(path)
    return df


def _parse(path: Path) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    try:
        if suffix in (".csv", ".csv.gz", ".tsv", ".tsv.gz"):
            sep = "\t" if suffix.startswith(".tsv") else ","
            df = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, na_values=[""])
            _check_header(path, sep)
            return df
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".jsonl.gz"):
            return pd.read_json(path, lines=True, dtype=False)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except InputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot be parsed: {' '.join(str(e).split())}", file=str(path)) from e
    except Exception as e:  # pyarrow and parser errors of a damaged file
        raise InputError(f"cannot be parsed ({type(e).__name__}): {' '.join(str(e).split())}", file=str(path)) from e
    raise InputError(f"unknown table format {suffix!r} (use .csv, .tsv, .parquet or .jsonl)", file=str(path))


def _check_header(path: Path, sep: str) -> None:
    """A CSV/TSV header that names a column twice is an error (pandas would read the second as ``<name>.1``)."""
    import csv
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as f:
        header = next(csv.reader(f, delimiter=sep), [])
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise InputError(f"the header names the column(s) {twice} more than once", file=str(path), line=1)


def read_nonempty(path: str | Path, what: str, empty: str | None = None) -> pd.DataFrame:
    """:func:`read_raw` of a file that must exist (``<what> file not found``) and hold rows
    (``empty``, by default ``the <what> table is empty``)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"a folder where the {what} file should be", file=str(path))
    if not path.is_file():
        raise InputError(f"{what} file not found", file=str(path))
    df = read_raw(path)
    if df.empty:
        raise InputError(empty or f"the {what} table is empty", file=str(path))
    return df


def read_table(path: str | Path, kind: str) -> pd.DataFrame:
    """Read a canonical table of ``kind`` and check its columns; ids become strings."""
    return check_columns(read_nonempty(path, kind), kind)


def _map_unique(values: pd.Series, func) -> pd.Series:
    """``values.map(func)`` computed once per distinct value (NA kept); ``values`` itself
    when it is a string column that ``func`` leaves unchanged."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    mapped = [func(v) for v in uniques]
    if pd.api.types.is_string_dtype(values.dtype) and all(
        isinstance(u, str) and m == u for m, u in zip(mapped, uniques)
    ):
        return values
    return pd.Series(np.array(mapped + [np.nan], dtype=object)[codes], index=values.index, name=values.name)


def _id_key(value) -> str:
    return option_key(value) if isinstance(value, (int, float, np.integer, np.floating)) else str(value).strip()


def _is_na(values: pd.Series) -> np.ndarray:
    """NA cells: missing, or (as text) empty or ``NA``."""
    na = values.isna().to_numpy()
    if values.dtype == object or pd.api.types.is_string_dtype(values.dtype):
        text = _map_unique(values, lambda v: str(v).strip()).to_numpy()
        na = na | np.isin(text, NA_ANSWERS)
    return na


def check_columns(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Required columns present and non-null (but those the spec's ``na_allowed`` lets be NA); id columns as
    stripped strings.

    NA in a ``na_absent`` column (the annotations' ``answer``) makes the row absent: it is
    dropped, counted in ``df.attrs["absent_rows"]`` and in a warning.
    """
    spec = SPECS[kind]
    src = source_of(df)
    missing = [c for c in spec.required if c not in df.columns]
    if missing:
        raise InputError(
            f"missing required column(s) {missing} in the {kind} table (has {list(df.columns)})",
            file=src,
            column=missing[0],
        )
    absent = np.zeros(len(df), dtype=bool)
    for column in spec.na_absent:
        absent |= _is_na(df[column])
    for column in (c for c in spec.required if c not in spec.na_allowed):
        null = df[column].isna().to_numpy() & ~absent
        if null.any():
            raise InputError(
                f"empty value in required column ({int(null.sum())} such rows)",
                file=src,
                row=int(df.index[null.argmax()]),
                column=column,
            )
    df = df[~absent].copy() if absent.any() else df.copy()
    df.attrs["source"] = src
    df.attrs["absent_rows"] = int(absent.sum())
    if absent.any():
        log.warning(
            "%s: %d rows with an NA %s are absent rows (dropped)", src, int(absent.sum()), "/".join(spec.na_absent)
        )
    for column in spec.ids:
        if column in df.columns:
            df[column] = _ids(df[column])
    return df


def _ids(values: pd.Series) -> pd.Series:
    """Id cells as stripped strings (numbers by :func:`option_key`); string columns vectorised."""
    if pd.api.types.is_string_dtype(values.dtype) and values.dtype != object:
        stripped = values.str.strip()
        return stripped if (stripped != values).any() else values
    return _map_unique(values, _id_key)


def validate_annotations(df: pd.DataFrame, rubric: Rubric) -> pd.DataFrame:
    """Check questions and answers against the rubric; ``answer`` becomes the option key.

    An empty or ``NA`` answer is an absent row (dropped and counted, see :func:`check_columns`).
    Exact duplicate rows are dropped; the same (text, judge, question, round) with
    different answers is an error naming both rows. The optional ``round`` column marks a
    judge's repeated annotation of a text (a separate observation); it defaults to "1".
    """
    absent = int(df.attrs.get("absent_rows", 0))
    df = check_columns(df, "annotations")
    df.attrs["absent_rows"] = absent + df.attrs["absent_rows"]
    src = source_of(df)
    if df.empty:
        raise InputError("every annotation is NA (absent)", file=src, column="answer")
    unknown = ~df["question_id"].isin(rubric.ids)
    if unknown.any():
        row = df.index[unknown.argmax()]
        raise InputError(
            f"unknown question id {df.at[row, 'question_id']!r} (rubric {rubric.name!r} has {rubric.ids})",
            file=src,
            row=int(row),
            column="question_id",
        )
    pairs = pd.MultiIndex.from_arrays([df["question_id"], df["answer"].astype(object)])
    codes, uniques = pd.factorize(pairs)
    keys = []
    for qid, answer in uniques:
        question = rubric[qid]
        index = question.index_of(answer)
        if index is None:
            row = df.index[(codes == len(keys)).argmax()]
            raise InputError(
                f"answer {answer!r} is not an option of {qid} (options {list(question.keys)})",
                file=src,
                row=int(row),
                column="answer",
            )
        keys.append(question.options[index].key)
    df["answer"] = np.array(keys, dtype=object)[codes]
    df["round"] = df["round"].fillna("1").astype(str) if "round" in df.columns else "1"
    cell = ["text_id", "judge_id", "question_id", "round"]
    dup = df.duplicated(cell, keep=False)
    if dup.any():
        groups = df[dup].groupby(cell, sort=False)["answer"]
        conflicting = groups.nunique()
        conflicting = conflicting[conflicting > 1]
        if len(conflicting):
            text, judge, qid, rnd = conflicting.index[0]
            rows = df[
                dup & (df.text_id == text) & (df.judge_id == judge) & (df.question_id == qid) & (df["round"] == rnd)
            ].index.tolist()
            raise InputError(
                f"duplicate (text {text!r}, judge {judge!r}, question {qid!r}, round {rnd!r}) with different answers in rows {rows}",
                file=src,
                row=int(rows[1]),
                column="answer",
            )
        df = df[~df.duplicated(cell, keep="first")]
    df.attrs["source"] = src
    return df


def _option_hash(options) -> np.ndarray:
    return pd.util.hash_array(np.asarray(options, dtype=object))


def validate_features(df: pd.DataFrame, rubric: Rubric | None = None) -> pd.DataFrame:
    """Check probabilities and block shapes; ``option`` becomes the option key.

    A block is one (text, source, question). Probabilities must be finite and >= 0; a
    block sums to at most 1 + options × 1e-6 (6-decimal rounding; they are kept
    unnormalised). A block above that but at most 1 + :data:`API_SUM_TOLERANCE` holds an API's
    rounded log-probabilities: it is renormalised to 1 and counted in ``df.attrs["renormalised_blocks"]``
    and a warning; a larger sum is an error. A distribution block (2+ options) whose probabilities are all 0 is missing:
    it is dropped (masked like an absent block) and counted in ``df.attrs["zero_blocks"]`` and
    a warning; a one-option block is a value (e.g. a summary's coverage fraction), 0 included. Blocks
    of a rubric question must offer exactly that question's ``llm_options``; blocks of other
    questions must all offer the same options. The optional ``samples`` (the answers a sampled block was
    counted from) is a whole number >= 1, the same on every row of its block, or NA on all of them (a
    distribution read otherwise); it becomes a nullable integer column. Checks are vectorised (1.5M rows in
    about a second).
    """
    df = check_columns(df, "features")
    src = source_of(df)
    df["option"] = _map_unique(df["option"], option_key)
    df["prob"] = _probabilities(df, src)
    blocks = _FeatureBlocks.of(df)
    blocks.check_options_once(df, src)
    blocks.check_sums(df, src)
    df["prob"], renormalised = blocks.renormalise_api_rounding(df, src)
    blocks.check_option_sets(df, rubric, src)
    if "samples" in df.columns:
        df["samples"] = blocks.checked_samples(df, src)
    zero = (blocks.sums <= 0) & (
        blocks.counts >= 2
    )  # a one-option block is a value (e.g. a coverage fraction): its 0 is data
    if zero.any():
        b = int(zero.argmax())
        row = df.index[(blocks.code == b).argmax()]
        log.warning(
            "%s: %d blocks of all-zero probabilities are treated as missing (masked), e.g. text %r, source %r, question %r (row %d)",
            src,
            int(zero.sum()),
            df.at[row, "text_id"],
            df.at[row, "source"],
            df.at[row, "question_id"],
            int(row),
        )
        df = df[~zero[blocks.code]].copy()
    df.attrs["source"] = src
    df.attrs["zero_blocks"] = int(zero.sum())
    df.attrs["renormalised_blocks"] = renormalised
    return df


def _probabilities(df: pd.DataFrame, src: str) -> np.ndarray:
    """The ``prob`` column as floats; a cell that is not a finite number >= 0 is an error."""
    prob = df["prob"] if pd.api.types.is_float_dtype(df["prob"]) else pd.to_numeric(df["prob"], errors="coerce")
    values = prob.to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        row = df.index[bad.argmax()]
        raise InputError(
            f"probability {df.at[row, 'prob']!r} is not a finite number >= 0", file=src, row=int(row), column="prob"
        )
    return values


@dataclass(frozen=True)
class _FeatureBlocks:
    """The (text, source, question) blocks of a features table, as integer codes for vectorised checks.

    ``code``: each row's block; ``option_code``/``options``: each row's option; ``pair``: each
    block's (source, question) pair, named by ``pair_names``; ``sums``/``counts``: each block's
    probability mass and number of options."""

    code: np.ndarray
    option_code: np.ndarray
    options: pd.Index
    pair: np.ndarray
    pair_names: list[tuple[str, str]]
    sums: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame) -> _FeatureBlocks:
        factors = [pd.factorize(df[c]) for c in ("text_id", "source", "question_id")]
        codes = [f[0].astype(np.int64) for f in factors]
        sizes = [len(f[1]) for f in factors]
        pair_code, pair_values = pd.factorize(codes[1] * sizes[2] + codes[2])
        block_code = np.unique(codes[0] * (sizes[1] * sizes[2]) + codes[1] * sizes[2] + codes[2], return_inverse=True)[
            1
        ]
        option_code, option_values = pd.factorize(df["option"])
        n_blocks = int(block_code.max()) + 1
        block_pair = np.zeros(n_blocks, dtype=np.int64)
        block_pair[block_code] = pair_code
        pair_names = [(factors[1][1][v // sizes[2]], factors[2][1][v % sizes[2]]) for v in pair_values]
        sums = np.bincount(block_code, weights=df["prob"].to_numpy(), minlength=n_blocks)
        counts = np.bincount(block_code, minlength=n_blocks)
        return cls(block_code, option_code, option_values, block_pair, pair_names, sums, counts)

    def check_options_once(self, df: pd.DataFrame, src: str) -> None:
        """No option listed twice in one block; the error names the block, the option and the two rows that list it
        (a whole block listed twice: two extractions of one source name in one table)."""
        cell = self.code * len(self.options) + self.option_code
        dup = pd.Series(cell).duplicated(keep=False).to_numpy()
        if dup.any():
            first = dup.argmax()
            rows = df.index[cell == cell[first]].tolist()[:2]
            block = self.code == self.code[first]
            whole = bool(dup[block].all())
            at = df.iloc[first]
            name = f"(text {at['text_id']!r}, source {at['source']!r}, question {at['question_id']!r})"
            why = (
                ": the whole block is listed twice, as when two extraction runs share a source name (give each its own "
                "--source, or keep one)"
                if whole
                else ""
            )
            raise InputError(
                f"option listed twice in the block {name}: {self.options[self.option_code[first]]!r} in rows {rows}{why}",
                file=src,
                row=int(rows[1]),
                column="option",
            )

    def _rounded(self) -> np.ndarray:
        """Blocks whose sum is within 6-decimal rounding of 1 or below."""
        return self.sums <= 1 + self.counts * PROB_TOLERANCE + 1e-12

    def _block(self, df: pd.DataFrame, b: int) -> tuple[int, str]:
        """Block ``b``'s first row and its name for messages."""
        row = df.index[(self.code == b).argmax()]
        name = (
            f"(text {df.at[row, 'text_id']!r}, source {df.at[row, 'source']!r}, question {df.at[row, 'question_id']!r})"
        )
        return int(row), name

    def check_sums(self, df: pd.DataFrame, src: str) -> None:
        """No block sums to more than 1 + :data:`API_SUM_TOLERANCE` (or options × :data:`PROB_TOLERANCE`)."""
        over = ~self._rounded() & (self.sums > 1 + API_SUM_TOLERANCE)
        if over.any():
            b = int(over.argmax())
            row, name = self._block(df, b)
            raise InputError(
                f"probabilities of block {name} sum to {self.sums[b]:.6f} > 1 + {API_SUM_TOLERANCE:g} "
                f"(an API's rounding; 6-decimal rounding allows {self.counts[b]} options × {PROB_TOLERANCE:g})",
                file=src,
                row=row,
                column="prob",
            )

    def renormalise_api_rounding(self, df: pd.DataFrame, src: str) -> tuple[np.ndarray, int]:
        """The probabilities with each block above 6-decimal rounding (an API's rounded log-probabilities,
        at most 1 + :data:`API_SUM_TOLERANCE` after :meth:`check_sums`) divided by its sum; how many such blocks."""
        rounded = ~self._rounded()
        prob = df["prob"].to_numpy(dtype=float)
        if not rounded.any():
            return prob, 0
        b = int(rounded.argmax())
        row, name = self._block(df, b)
        log.warning(
            "%s: %d blocks sum to more than 1 by API rounding (at most %.6f, <= 1 + %g) and are renormalised to 1, e.g. block %s (row %d)",
            src,
            int(rounded.sum()),
            float(self.sums[rounded].max()),
            API_SUM_TOLERANCE,
            name,
            row,
        )
        return np.where(rounded[self.code], prob / self.sums[self.code], prob), int(rounded.sum())

    def checked_samples(self, df: pd.DataFrame, src: str) -> pd.Series:
        """The ``samples`` column as nullable integers: each cell NA or a whole number >= 1, one value (or NA)
        per block; else an error naming the first offending row."""
        raw = df["samples"]
        na = _is_na(raw)
        numbers = pd.to_numeric(raw.where(~na), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        bad = ~na & ~(np.isfinite(numbers) & (numbers >= 1) & (numbers == np.round(numbers)))
        if bad.any():
            row = df.index[bad.argmax()]
            raise InputError(
                f"samples {df.at[row, 'samples']!r} is not a whole number >= 1 (or NA)",
                file=src,
                row=int(row),
                column="samples",
            )
        key = np.where(na, -1.0, numbers)
        low = np.full(len(self.sums), np.inf)
        high = np.full(len(self.sums), -np.inf)
        np.minimum.at(low, self.code, key)
        np.maximum.at(high, self.code, key)
        varies = (low != high)[self.code]
        if varies.any():
            b = self.code[varies.argmax()]
            rows = np.flatnonzero(self.code == b)
            first = df.index[rows[0]]
            other = df.index[rows[(key[rows] != key[rows[0]]).argmax()]]
            _, name = self._block(df, int(b))
            raise InputError(
                f"samples of block {name} differ between rows {int(first)} and {int(other)} "
                f"({df.at[first, 'samples']!r}, {df.at[other, 'samples']!r}): one value per block",
                file=src,
                row=int(other),
                column="samples",
            )
        return pd.Series(pd.arrays.IntegerArray(np.where(na, 0, numbers).astype(np.int64), na), index=df.index)

    def check_option_sets(self, df: pd.DataFrame, rubric: Rubric | None, src: str) -> None:
        """Each (source, question)'s blocks offer the rubric question's ``llm_options``, or (another
        question) all the same options as its most common block."""
        order = np.argsort(self.code, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(self.code[order]) != 0])
        signature = np.add.reduceat(
            _option_hash(self.options)[self.option_code][order], starts
        )  # order-free hash of each block's option set
        blocks = pd.DataFrame({"pair": self.pair, "signature": signature, "count": self.counts})
        for pair, part in blocks.groupby("pair", sort=False):
            source, qid = self.pair_names[pair]
            if rubric is not None and qid in rubric:
                keys = list(rubric[qid].llm_options)
                expected_sig, expected = np.add.reduce(_option_hash(keys)), keys
            else:
                expected_sig = part.signature.value_counts().index[0]
                expected = None
            wrong = part.index[part.signature.to_numpy() != expected_sig]
            if len(wrong):
                rows = self.code == wrong[0]
                row = df.index[rows.argmax()]
                found = sorted(df["option"].to_numpy()[rows])
                if expected is None:
                    model = part.index[part.signature.to_numpy() == expected_sig][0]
                    expected = sorted(df["option"].to_numpy()[self.code == model])
                raise InputError(
                    f"features block (text {df.at[row, 'text_id']!r}, source {source!r}, question {qid!r}) has {len(found)} options "
                    f"{found}, expected {len(expected)} {sorted(expected)}",
                    file=src,
                    row=int(row),
                    column="option",
                )


@dataclass
class Tables:
    """One data set in canonical form: annotations, features and (optionally) texts."""

    annotations: pd.DataFrame
    features: pd.DataFrame
    texts: pd.DataFrame | None = None

    def subset(self, text_ids) -> Tables:
        """The rows of these texts only."""
        keep = set(text_ids)
        pick = lambda df: None if df is None else _keep_source(df, df[df.text_id.isin(keep)])
        return Tables(pick(self.annotations), pick(self.features), pick(self.texts))

    @property
    def text_ids(self) -> list[str]:
        return sorted(self.annotations.text_id.unique())


def _keep_source(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    new.attrs["source"] = source_of(old)
    return new


def require_features(annotations: pd.DataFrame, features: pd.DataFrame, drop: bool) -> pd.DataFrame:
    """Annotations whose text has no features: an error, or dropped with a warning if ``drop``."""
    missing = ~annotations.text_id.isin(features.text_id.unique())
    if not missing.any():
        return annotations
    texts = annotations.text_id[missing].nunique()
    message = f"{int(missing.sum())} annotations on {texts} texts have no features (first: text {annotations.text_id[missing].iloc[0]!r})"
    if not drop:
        raise InputError(
            message + "; set data.drop_unfeatured=true to drop them",
            file=source_of(annotations),
            row=int(annotations.index[missing.argmax()]),
            column="text_id",
        )
    log.warning("%s: dropped %s", source_of(annotations), message)
    return _keep_source(annotations, annotations[~missing])


def load_tables(
    annotations: str | Path,
    features: str | Path,
    rubric: Rubric | str | Path,
    texts: str | Path | None = None,
    drop_unfeatured: bool = False,
) -> Tables:
    """Read and validate the canonical tables from files; ``rubric``: a :class:`Rubric` or a rubric YAML's path."""
    rubric = as_rubric(rubric)
    ann = validate_annotations(read_table(annotations, "annotations"), rubric)
    feat = validate_features(read_table(features, "features"), rubric)
    ann = require_features(ann, feat, drop_unfeatured)
    txt = read_table(texts, "texts") if texts else None
    return Tables(ann, feat, txt)
