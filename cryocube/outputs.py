"""The output contract, checked before anything is written: a command writes at its `--out` only to
a new or empty path or a cryocube output of the same kind, recognised by the marker it wrote first
(older ones by what they hold); anything else is refused in one sentence, `--overwrite` or not."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import __version__
from . import store as _store
from .cube import COMPLETE_ATTR, PLAN_ATTR
from .errors import UserError, causes

MARKER = ".cryocube-output.json"  # in folders (results, studies, reports, quickstart)
ZARR_MARKER = "cryocube_output"  # in a Zarr store's root attributes (cubes, embedding stores)


@dataclass(frozen=True)
class Kind:
    what: str  # "a cube": how a refusal names it
    zarr: bool = False  # a Zarr store (marked in its attributes) rather than a folder of files
    file: bool = False  # one file (recognised by its first line)
    first_line: Callable[[str], bool] | None = None


KINDS: dict[str, Kind] = {
    "cube": Kind("a cryocube cube (written by convert)", zarr=True),
    "embeddings": Kind("a cryocube embedding store (written by embed)", zarr=True),
    "results": Kind("a cryocube results folder (written by evaluate or probe)"),
    "study": Kind("a cryocube study (written by tune)"),
    "report": Kind("a cryocube report (written by report)"),
    "quickstart": Kind("a cryocube quickstart folder"),
    "submission": Kind(
        "a cryocube submission CSV (written by embed --format csv)",
        file=True,
        first_line=lambda line: line.lstrip("\ufeff").startswith("id,0"),
    ),
}

# what a results folder killed before its first record holds
RESULTS_FIRST = {"features", "embeddings", "logs", "results.parquet", "results.jsonl.torn"}
# outputs of cryocube versions without a marker: kind -> test on its entry names, first match wins
LEGACY: dict[str, Callable[[set[str]], bool]] = {
    "study": lambda names: "study.journal" in names,
    "results": lambda names: bool({"results.jsonl", "runs"} & names) or names <= RESULTS_FIRST,
    "report": lambda names: bool({"report.html", "report.md"} & names),
    "quickstart": lambda names: "cubes" in names and names <= {"raw", "cubes", "results", "report"},
}


def marker(kind: str, command: str) -> dict:
    """A new output's stamp, written first (marker file or Zarr attribute): identify reads it."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat()
    return {"kind": kind, "command": command, "cryocube": __version__, "created": now}


def _zarr_kind(attrs: dict) -> str | None:
    """The kind of a Zarr store from its root attributes (None: a store cryocube did not write)."""
    if isinstance(attrs.get(ZARR_MARKER), dict) and attrs[ZARR_MARKER].get("kind") in KINDS:
        return attrs[ZARR_MARKER]["kind"]
    converted = str(attrs.get("converter", "")).startswith("cryocube")
    if converted or {COMPLETE_ATTR, PLAN_ATTR} & set(attrs):
        return "cube"
    if "cryocube_embedding_complete" in attrs or {"key", "source"} <= set(attrs):
        return "embeddings"
    return None


@dataclass(frozen=True)
class Found:
    """What is at a path: state absent, empty, file, ours (kind set) or foreign (`what` says it)."""

    state: str
    kind: str | None = None
    what: str = ""
    # entries beside a folder's manifest (files put there after it was written)
    strangers: tuple[str, ...] = ()


def identify(url: str, storage_options=None, expect: str | None = None) -> Found:
    """What `url` holds, as far as the output contract is concerned."""
    fs, path = _store.fs_path(url, storage_options)
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    if not fs.exists(path):
        return Found("absent")
    if fs.isfile(path):
        k = KINDS.get(expect or "")
        if k and k.file and k.first_line:
            with fs.open(path, "rb") as f:
                line = f.readline(4096).decode("utf-8", "replace")
            if k.first_line(line):
                return Found("ours", expect, k.what)
        return Found("file", what="a file")
    names = {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}
    names.discard(path.rstrip("/").rsplit("/", 1)[-1])  # some object stores list the folder itself
    if not names:
        return Found("empty")
    if MARKER in names:
        try:
            mark_ = json.loads(fs.cat_file(f"{path.rstrip('/')}/{MARKER}"))
            kind = mark_.get("kind")
        except (ValueError, OSError, AttributeError):
            mark_, kind = {}, None
        if kind in KINDS:
            listed = mark_.get("files")  # none listed (older markers): no strangers
            top = {f.split("/", 1)[0] for f in listed} if isinstance(listed, list) else names
            return Found("ours", kind, KINDS[kind].what, tuple(sorted(names - {MARKER} - top)))
    if "zarr.json" in names:
        try:
            attrs = json.loads(fs.cat_file(f"{path.rstrip('/')}/zarr.json")).get("attributes") or {}
        except (ValueError, OSError):
            attrs = {}
        if kind := _zarr_kind(attrs):
            return Found("ours", kind, KINDS[kind].what)
        return Found("foreign", what="a Zarr store cryocube did not write")
    for kind, test in LEGACY.items():
        if test(names):
            return Found("ours", kind, KINDS[kind].what)
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    entries = f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"
    return Found("foreign", what=f"a folder cryocube did not write ({entries})")


def _norm(url: str) -> str:
    url = str(url)
    if _store.is_remote(url):
        proto, _, rest = url.partition("://")
        return f"{proto}://{rest.strip('/')}"
    return os.path.realpath(_store.local_path(url))


def _inside(inner: str, outer: str) -> bool:
    sep = "/" if "://" in outer else os.sep
    return inner.startswith(outer.rstrip(sep) + sep)


def check_inputs(
    url: str, inputs: Iterable[tuple[str, str | None]], flag: str = "--out", inside_ok: bool = False
) -> None:
    """Refuse an output that is, holds or (unless `inside_ok`) lies inside one of the inputs."""
    out = _norm(url)
    for name, given in inputs:
        if not given:
            continue
        inp = _norm(given)
        if out == inp:
            raise UserError(
                f"{flag} {url} is this command's input ({name} {given}); choose another {flag}"
            )
        if _inside(out, inp) and not inside_ok:
            raise UserError(
                f"{flag} {url} lies inside this command's input ({name} {given}); choose a {flag}"
                " outside it"
            )
        if _inside(inp, out):
            raise UserError(
                f"the input {name} {given} lies inside {flag} {url}; choose a {flag} that does not"
                " hold an input"
            )


def claim(
    url: str,
    kind: str,
    command: str,
    *,
    inputs: Iterable[tuple[str, str | None]] = (),
    flag: str = "--out",
    storage_options=None,
    write_marker: bool = True,
) -> Found:
    """What is at `url`, once checked that `command` may write a `kind` output there, which is then
    marked (`write_marker=False`: a dry run)."""
    k = KINDS[kind]
    check_inputs(url, inputs, flag)
    found = identify(url, storage_options, expect=kind)
    if found.state == "file":
        raise UserError(
            f"{flag} {url} is a file, not {'a folder' if not k.file else 'a file cryocube wrote'}; "
            f"{command} refuses to replace it (choose another {flag})"
        )
    if found.state == "foreign" or (k.file and found.state == "empty"):
        raise UserError(
            f"{flag} {url} holds {found.what or 'a folder'}; {command} writes only to a new"
            f" path{' ' if k.file else ', an empty folder '}or {k.what.split(' (')[0]} (choose"
            f" another {flag}; --overwrite never replaces files cryocube did not write)"
        )
    if found.state == "ours" and found.kind != kind:
        raise UserError(
            f"{flag} {url} holds {found.what}, not {k.what}; {command} refuses to write there "
            f"(choose another {flag}; --overwrite only replaces {k.what.split(' (')[0]})"
        )
    if found.strangers:
        shown = ", ".join(found.strangers[:3]) + (", ..." if len(found.strangers) > 3 else "")
        raise UserError(
            f"{flag} {url} holds {found.what} and files it did not write ({shown}); {command} would"
            f" replace the whole folder, so it refuses (move them out, or choose another {flag})"
        )
    if write_marker and not k.zarr and not k.file:
        mark(url, kind, command, storage_options)
    return found


def mark(url: str, kind: str, command: str, storage_options=None) -> None:
    """Write a folder's marker if it has none (the first thing written into a claimed folder)."""
    m = _store.join(url, MARKER)
    if not _store.file_exists(m, storage_options):
        _store.write_atomic(m, json.dumps(marker(kind, command), indent=1) + "\n", storage_options)


# -- whole folders ---------------------------------------------------------------------------
@contextlib.contextmanager
def staged_folder(out: str | Path, kind: str, command: str) -> Iterator[Path]:
    """A local folder output built beside `out` and swapped in whole: a build killed midway leaves
    the previous output as it was."""
    out = Path(out)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{out.name}.building-*"):  # ours: a build killed before its swap
        shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".{out.name}.building-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        mark(str(tmp), kind, command)
        yield tmp
        files = sorted(
            p.relative_to(tmp).as_posix()
            for p in tmp.rglob("*")
            if p.is_file() and p.name != MARKER
        )
        _store.write_atomic(
            str(tmp / MARKER), json.dumps(marker(kind, command) | {"files": files}, indent=1) + "\n"
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


# -- full disk -------------------------------------------------------------------------------
def disk_full_message(e: BaseException, out: str | None) -> str | None:
    """One sentence for a full disk (or quota) naming the file or output written; else None."""
    full = (errno.ENOSPC, errno.EDQUOT)
    err = next((x for x in causes(e) if isinstance(x, OSError) and x.errno in full), None)
    if err is None:
        return None
    where = err.filename or out or "the output"
    why = "disk quota exceeded" if err.errno == errno.EDQUOT else "no space left on device"
    return (
        f"{why} writing {where}; free some space (or choose another --out) and rerun the same"
        " command"
    )
