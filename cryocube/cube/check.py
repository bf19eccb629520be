"""`cryocube inspect --verify`: every sample against its digest, every block against the cube
checksum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import store as _store
from ..errors import UserError
from ..progress import progress_bar
from .digests import block_digest, cube_checksum, digest_rows, digest_vars, sample_digests
from .read import not_a_cube
from .schema import COMPLETE_ATTR, IncompleteCubeError, as_text


@dataclass
class VerifyReport:
    url: str
    n_samples: int
    damaged: list[dict]  # {"sample", "source", "what"}
    checksum_ok: bool
    digests: bool  # False: a cube without per-sample digests (blocks only)

    @property
    def ok(self) -> bool:
        """What `inspect --verify` exits 0 on: nothing damaged, block digests match the checksum."""
        return not self.damaged and self.checksum_ok


def verify(url: str, storage_options: dict | None = None, progress: bool = True) -> VerifyReport:
    """Every sample against its digest, blocks against theirs and the checksum."""
    _store.register_options(url, storage_options)
    g = _store.open_group(url, "r") if _store.exists(url, storage_options) else None
    if g is None or "schema_version" not in g.attrs:
        raise UserError(not_a_cube(url, storage_options))
    if COMPLETE_ATTR not in g.attrs:
        raise IncompleteCubeError(
            f"{url}: cube is incomplete (no '{COMPLETE_ATTR}' marker); nothing to verify yet"
        )
    n = g["image"].shape[0]
    # what the per-sample digests cover, in part order
    parts = ("image", "target" if g.attrs.get("kind") == "samples" else "label", *digest_vars(g))
    bs = int(g.attrs.get("block_samples") or 16)
    stored_blocks = np.asarray(g["block_digest"][:])
    sources = as_text(g["source"][:])
    damaged, computed = [], []  # {"sample", "source", "what"}; each block's digest
    with progress_bar(f"verify {url}", n, progress) as bar:
        for b in range(stored_blocks.shape[0]):
            s0, s1 = b * bs, min((b + 1) * bs, n)
            computed.append(_verify_block(g, b, (s0, s1), parts, sources, stored_blocks, damaged))
            bar.advance(s1 - s0)
    checksum_ok = cube_checksum(np.array(computed)) == g.attrs[COMPLETE_ATTR]["checksum"]
    return VerifyReport(url, n, damaged, checksum_ok, "sample_digest" in g)


def _verify_block(g, b: int, span, parts, sources, stored, damaged: list) -> np.ndarray:
    """Block `b`'s digest from its samples (zeros if undecodable); damage goes to `damaged`."""
    s0, s1 = span
    has = "sample_digest" in g

    def hurt(i: int, what: str) -> None:
        damaged.append({"sample": i, "source": str(sources[i]), "what": what})

    try:
        arrs = [np.asarray(g[v][s0:s1]) for v in parts]
    except Exception:  # noqa: BLE001 - find the samples (and variables) whose chunk cannot be decoded
        for i in range(s0, s1):
            for v in parts:
                try:
                    g[v][i]
                except Exception as e:  # noqa: BLE001
                    hurt(i, f"{v} unreadable ({type(e).__name__})")
        return np.zeros(stored.shape[1], np.uint8)
    got = sample_digests(*arrs)
    if has:
        want = np.asarray(g["sample_digest"][s0:s1])
        for k in np.flatnonzero((got != want).any(axis=1)):
            what = ", ".join(v for v, a, w in zip(parts, got[k], want[k]) if a != w)
            hurt(s0 + int(k), f"{what} digest mismatch")
    blk = block_digest(got, *(digest_rows(a)[0].nbytes for a in arrs))
    if not np.array_equal(blk, stored[b]) and not has:
        hurt(s0, f"block {b} ({s0}..{s1 - 1}) digest mismatch")
    return blk
